"""16,384 concurrent episodes against one server: errors, step latency, memory.

Question: does one vector env hold 16k concurrent episodes (NeMo Gym's "16k concurrent
requests"), without errors and in bounded memory, on both sides of the wire?

One ``NemoGymVectorEnv`` of ``--num-envs`` sub-envs (default 16,384) plays scripted episodes
on one server for ``--cycles`` whole cycles (reset, every turn, verify, autoreset): every
sub-env's requests of a step are in flight at once, bounded only by ``max_in_flight``.
Reported: failed sub-env steps (must be 0), p50/p99 latency of one sub-env's step (from the
vector step's start to that sub-env's result: it includes queueing behind the other 16k),
the vector step's wall time, peak RSS of this (the env's) process, and the server's RSS
sampled through the run, with its live sessions for servers that keep per-session state.

Usage::

    python benchmarks/scale.py                                   # 16,384 envs, 1 cycle
    python benchmarks/scale.py --server example_session_state_mgmt --name scale_stateful
    python benchmarks/scale.py --num-envs 2048 --cycles 2        # smaller, quicker

Writes ``benchmarks/results/scale.json``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=16_384)
    parser.add_argument("--cycles", type=int, default=1, help="whole episodes each sub-env plays")
    parser.add_argument("--server", default=harness.SERVER, help="a bundled server with a scripted.py")
    parser.add_argument("--max-in-flight", type=int, default=None, help="default: the env's own default")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop stepping after this long")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="scale")
    return parser.parse_args(argv)


class _Sampler(threading.Thread):
    """Samples a process tree's RSS every ``interval_s`` until stopped; keeps the peak."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.peak_mib = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.peak_mib = max(self.peak_mib, harness.rss_mib(self.pid))

    def stop(self) -> float:
        self._done.set()
        self.join()
        return self.peak_mib


def timed_vector_env(**kwargs: Any) -> Any:
    """A ``NemoGymVectorEnv`` that records each sub-env step's latency from the vector step's start."""
    from nemo_gym_env.envs.vector import NemoGymVectorEnv

    class Timed(NemoGymVectorEnv):
        def __init__(self, **kwargs: Any):
            super().__init__(**kwargs)
            self.step_started = 0.0
            self.latencies: list[float] = []

        async def _astep(self, actions: Any) -> Any:
            self.step_started = time.perf_counter()
            return await super()._astep(actions)

        async def _one_step(self, i: int, items: Any) -> Any:
            result = await super()._one_step(i, items)
            self.latencies.append(time.perf_counter() - self.step_started)
            return result

    return Timed(**kwargs)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    rows = harness.tasks(args.server)
    play = harness.player(args.server)
    n = args.num_envs
    with harness.launched(args.server) as (proc,):
        server_idle_mib = harness.rss_mib(proc.pid)
        sampler = _Sampler(proc.pid)
        sampler.start()
        kwargs: dict[str, Any] = {"max_in_flight": args.max_in_flight} if args.max_in_flight else {}
        started = time.perf_counter()
        envs = timed_vector_env(base_url=proc.url, dataset=rows, num_envs=n, **kwargs)
        try:
            t0 = time.perf_counter()
            obs, infos = envs.reset(seed=0)
            reset_s = time.perf_counter() - t0
            errors = int(infos["_error"].sum()) if "_error" in infos else 0
            first_errors = list({str(e) for e in infos.get("error", []) if e})[:3] if errors else []
            server_after_reset_mib = harness.rss_mib(proc.pid)
            histories: list[list[dict]] = [[] for _ in range(n)]
            episodes = steps = 0
            reward_sum = 0.0
            step_walls: list[float] = []
            envs.latencies.clear()
            while episodes < n * args.cycles and time.perf_counter() - started < args.max_seconds:
                live = envs.live_mask
                actions: list[Any] = []
                for i in range(n):
                    if not live[i]:
                        histories[i] = []
                        actions.append(None)
                        continue
                    histories[i].extend(o for o in obs[i] if o.get("type") == "function_call_output")
                    actions.append(play(envs.episodes[i].task, histories[i]))
                t0 = time.perf_counter()
                obs, rewards, terminations, truncations, infos = envs.step(actions)
                step_walls.append(time.perf_counter() - t0)
                steps += 1
                ended = terminations | truncations
                episodes += int(ended.sum())
                reward_sum += float(rewards[ended].sum())
                if "_error" in infos:
                    step_errors = int(infos["_error"].sum())
                    if step_errors and len(first_errors) < 3:
                        first_errors += [str(e) for e, m in zip(infos["error"], infos["_error"]) if m][:3]
                    errors += step_errors
                print(f"  step {steps}: {step_walls[-1]:.2f} s, {episodes} episodes done, errors {errors}", flush=True)
            elapsed = time.perf_counter() - started
            latencies = envs.latencies
        finally:
            envs.close()
        server_peak_mib = sampler.stop()
        server_end_mib = harness.rss_mib(proc.pid)
        server_hwm_mib = harness.rss_mib(proc.pid, peak=True)
    env_peak_mib = harness.self_peak_rss_mib()
    results = {
        "server": args.server,
        "num_envs": n,
        "max_in_flight": args.max_in_flight,
        "cycles": args.cycles,
        "episodes": episodes,
        "errors": errors,
        "first_errors": first_errors[:3],
        "mean_reward": reward_sum / episodes if episodes else float("nan"),
        "steps": steps,
        "elapsed_s": elapsed,
        "episodes_per_s": episodes / elapsed if elapsed else float("nan"),
        "reset_s": reset_s,
        "substep_latency_s": {
            "p50": harness.percentile(latencies, 50), "p99": harness.percentile(latencies, 99),
            "max": max(latencies) if latencies else float("nan"), "count": len(latencies),
        },
        "vector_step_s": {"median": harness.median(step_walls), "max": max(step_walls) if step_walls else float("nan")},
        "env_peak_rss_mib": env_peak_mib,
        "server_rss_mib": {"idle": server_idle_mib, "after_reset": server_after_reset_mib,
                           "peak_sampled": server_peak_mib, "peak_hwm": server_hwm_mib, "end": server_end_mib},
        "target": {"errors": 0, "env_peak_rss_mib_below": 4096},
    }
    harness.print_table(
        ["num_envs", "episodes", "errors", "sub-step p50 s", "sub-step p99 s", "vector step s (median)",
         "env peak RSS MiB", "server peak RSS MiB"],
        [[n, episodes, errors, results["substep_latency_s"]["p50"], results["substep_latency_s"]["p99"],
          results["vector_step_s"]["median"], env_peak_mib, max(server_peak_mib, server_hwm_mib)]],
        title=f"{n} concurrent episodes on one {args.server} server",
    )
    path = harness.write_results(args.name, results, args.out)
    print(f"\nwrote {path}")
    return results


if __name__ == "__main__":
    main()
