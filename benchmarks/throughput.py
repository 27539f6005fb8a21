"""Vector env episodes/s against the server's own saturation rate, measured in the same run.

Question: how close does the native vector env come to what the server can take at all?

For each ``num_envs`` the vector env plays scripted ``example_multi_step`` episodes (the
server's ``scripted.py`` as an in-process policy; ``None`` for sub-envs about to autoreset)
for at least ``--min-seconds``, in whole cycles, and counts finished episodes per second.
Right before and after it, a plain load generator (``loadgen.py``: a minimal asyncio HTTP
client, no env) plays the same request mix per episode (``/seed_session``, the tool calls,
``/verify``, with cookies) at its best concurrency: that is the server's saturation rate,
and the ratio is taken against the mean of the two, so drift in the machine's load
cancels out. A saturation sweep over load-generator concurrencies (and over the httpx
client, for reference) opens the run.

Usage::

    python benchmarks/throughput.py                  # 1,4,16,64,256,1024,4096
    python benchmarks/throughput.py --quick          # 1,16,64 (CI)
    python benchmarks/throughput.py --num-envs 64 256 --min-seconds 10

Writes ``benchmarks/results/throughput.json`` and ``throughput.png`` (with the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
import loadgen

FULL = [1, 4, 16, 64, 256, 1024, 4096]
QUICK = [1, 16, 64]


@dataclass
class Settings:
    """Command-line settings of the throughput benchmark."""

    num_envs: list[int]
    """Vector sizes to measure."""
    min_seconds: float = 6.0
    """Each vector run lasts at least this long (and ends on a whole cycle of episodes)."""
    max_seconds: float = 90.0
    """...and at most this long, whole cycles or not."""
    saturation_seconds: float = 3.0
    """Length of each load-generator run."""
    rounds: int = 3
    """Vector runs per ``num_envs``, each between two load-generator runs; the median ratio is reported."""
    load_concurrency: list[int] | None = None
    """Load-generator concurrencies of the opening sweep (default 4, 16, 64, 256)."""
    max_in_flight: int | None = None
    """The vector env's ``max_in_flight`` (default: the env's own default)."""
    httpx_reference: bool = True
    """Also sweep the load generator on httpx, for reference (not used for the ratio)."""
    num_workers: int = 1
    """uvicorn workers of the server (the example server keeps no per-process state)."""
    servers: int = 1
    """Single-worker server processes to shard episodes over (``base_url`` list, sub-env i -> i % n)."""
    out: Path = harness.RESULTS_DIR
    """Folder for ``throughput.json`` and ``throughput.png``."""
    name: str = "throughput"
    """Results file name (without ``.json``)."""
    plot: bool = True
    """Draw ``<name>.png`` when matplotlib is installed."""


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, nargs="+", help=f"vector sizes (default {FULL})")
    parser.add_argument("--quick", action="store_true", help=f"CI settings: num_envs {QUICK}, short runs")
    parser.add_argument("--min-seconds", type=float)
    parser.add_argument("--max-seconds", type=float)
    parser.add_argument("--saturation-seconds", type=float)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--load-concurrency", type=int, nargs="+")
    parser.add_argument("--max-in-flight", type=int)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="throughput")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings(num_envs=args.num_envs or (QUICK if args.quick else FULL), out=args.out, name=args.name,
                        plot=not args.no_plot, num_workers=args.num_workers, servers=args.servers,
                        max_in_flight=args.max_in_flight, load_concurrency=args.load_concurrency)
    if args.quick:
        settings.min_seconds, settings.max_seconds, settings.saturation_seconds, settings.rounds = 2.0, 30.0, 1.5, 1
        settings.load_concurrency = settings.load_concurrency or [16, 64]
        settings.httpx_reference = False
    for key in ("min_seconds", "max_seconds", "saturation_seconds", "rounds"):
        if getattr(args, key) is not None:
            setattr(settings, key, getattr(args, key))
    return settings


def run_vector(urls: list[str], rows: list[dict], num_envs: int, settings: Settings,
               make_env: Any = None) -> dict[str, Any]:
    """Play scripted episodes on a vector env of ``num_envs``; returns counts, rate and timings.

    ``make_env(base_url=, dataset=, num_envs=, **kwargs)`` builds the vector env
    (default :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv`).
    """
    from nemo_gym_env.envs.vector import NemoGymVectorEnv

    play = harness.player()
    kwargs: dict[str, Any] = {"max_in_flight": settings.max_in_flight} if settings.max_in_flight else {}
    base_url: Any = urls[0] if len(urls) == 1 else urls
    envs = (make_env or NemoGymVectorEnv)(base_url=base_url, dataset=rows, num_envs=num_envs, **kwargs)
    try:
        t_reset = time.perf_counter()
        obs, infos = envs.reset(seed=0)
        first_reset_s = time.perf_counter() - t_reset
        tasks = [rows[int(t)] for t in infos["task_index"]]
        histories: list[list[dict]] = [[] for _ in range(num_envs)]
        episodes = errors = steps = 0
        reward_sum = 0.0
        step_times: list[float] = []
        started = time.perf_counter()
        cpu_start = os.times()
        while True:
            live = envs.live_mask
            actions: list[Any] = []
            for i in range(num_envs):
                if not live[i]:
                    histories[i] = []
                    actions.append(None)
                    continue
                histories[i].extend(o for o in obs[i] if o.get("type") == "function_call_output")
                actions.append(play(tasks[i], histories[i]))
            t0 = time.perf_counter()
            obs, rewards, terminations, truncations, infos = envs.step(actions)
            step_times.append(time.perf_counter() - t0)
            for i in range(num_envs):
                if not live[i]:  # started a new episode this step
                    tasks[i] = rows[int(infos["task_index"][i])]
            steps += 1
            ended = terminations | truncations
            episodes += int(ended.sum())
            reward_sum += float(rewards[ended].sum())
            if "_error" in infos:
                errors += int(infos["_error"].sum())
            elapsed = time.perf_counter() - started
            whole_cycle = bool(envs.live_mask.all()) and not ended.any()
            if (elapsed >= settings.min_seconds and whole_cycle and episodes > 0) or elapsed >= settings.max_seconds:
                break
        cpu_end = os.times()
        return {
            "num_envs": num_envs,
            "episodes": episodes,
            "errors": errors,
            "steps": steps,
            "elapsed_s": elapsed,
            "episodes_per_s": episodes / elapsed,
            "mean_reward": reward_sum / episodes if episodes else float("nan"),
            "step_s_median": harness.median(step_times),
            "step_s_max": max(step_times),
            "first_reset_s": first_reset_s,
            "env_cpu_s_per_episode": ((cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system))
            / max(episodes, 1),
        }
    finally:
        envs.close()


def saturation(urls: list[str], procs: list, requests: list, concurrency: int, seconds: float,
               client: str = "raw") -> dict:
    """The load generator's rate (several servers: all at once, summed), with CPU per episode on both sides."""
    import asyncio

    async def all_servers() -> list[loadgen.LoadResult]:
        return await asyncio.gather(*(loadgen.run_load_async(u, requests, client, concurrency, seconds, 1_000_000, 100)
                                      for u in urls))

    server_cpu = sum(harness.cpu_seconds(p.pid) for p in procs)
    own = os.times()
    parts = asyncio.run(all_servers())
    own_cpu = (os.times().user + os.times().system) - (own.user + own.system)
    episodes = sum(p.episodes for p in parts)
    return {
        "client": client, "concurrency": concurrency * len(urls), "episodes": episodes,
        "errors": sum(p.errors for p in parts), "elapsed_s": max(p.elapsed_s for p in parts),
        "episodes_per_s": sum(p.episodes_per_s for p in parts),
        "first_error": next((p.first_error for p in parts if p.first_error), None),
        "client_cpu_s_per_episode": own_cpu / max(episodes, 1),
        "server_cpu_s_per_episode": (sum(harness.cpu_seconds(p.pid) for p in procs) - server_cpu) / max(episodes, 1),
    }


def measure(urls: list[str], procs: list, rows: list[dict], requests: list, concurrency: int, num_envs: int,
            settings: Settings) -> dict[str, Any]:
    """Alternate load-generator and vector runs (sat, vec, sat, vec, ..., sat); the ratio is the median
    over rounds of each vector rate against the mean of the saturation runs on either side of it."""
    sats = [saturation(urls, procs, requests, concurrency, settings.saturation_seconds)]
    rounds = []
    for _ in range(settings.rounds):
        server_cpu = sum(harness.cpu_seconds(p.pid) for p in procs)
        vector = run_vector(urls, rows, num_envs, settings)
        vector["server_cpu_s_per_episode"] = (sum(harness.cpu_seconds(p.pid) for p in procs) - server_cpu) / max(
            vector["episodes"], 1)
        sats.append(saturation(urls, procs, requests, concurrency, settings.saturation_seconds))
        vector["saturation_episodes_per_s"] = (sats[-2]["episodes_per_s"] + sats[-1]["episodes_per_s"]) / 2
        vector["ratio"] = vector["episodes_per_s"] / vector["saturation_episodes_per_s"]
        rounds.append(vector)
    pick = sorted(rounds, key=lambda r: r["ratio"])[len(rounds) // 2]  # the median round
    result = {
        **pick,
        "episodes": sum(r["episodes"] for r in rounds),
        "errors": sum(r["errors"] for r in rounds),
        "load_errors": sum(s["errors"] for s in sats),
        "ratio": harness.median([r["ratio"] for r in rounds]),
        "episodes_per_s": harness.median([r["episodes_per_s"] for r in rounds]),
        "saturation_episodes_per_s": harness.median([r["saturation_episodes_per_s"] for r in rounds]),
        "rounds": rounds,
        "saturation_runs": [s["episodes_per_s"] for s in sats],
        "load_client_cpu_s_per_episode": harness.median([s["client_cpu_s_per_episode"] for s in sats]),
        "load_server_cpu_s_per_episode": harness.median([s["server_cpu_s_per_episode"] for s in sats]),
    }
    print(f"  num_envs={num_envs}: {result['episodes_per_s']:.1f} episodes/s, saturation "
          f"{result['saturation_episodes_per_s']:.1f}, ratio {result['ratio']:.2f} (rounds: "
          f"{', '.join(f'{r:.2f}' for r in sorted(x['ratio'] for x in rounds))}), errors {result['errors']}",
          flush=True)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    settings = parse_args(argv)
    rows = harness.tasks()
    requests = [harness.scripted_requests(row) for row in rows]
    config = {"num_workers": settings.num_workers} if settings.num_workers > 1 else {}
    with harness.launched(count=settings.servers, **config) as procs:
        urls = [p.url for p in procs]
        print(f"server: {harness.SERVER} x{len(urls)} ({settings.num_workers} worker(s) each) at {', '.join(urls)}")
        loadgen.run_load(urls[0], requests, concurrency=16, duration_s=1.0)  # warm up the server
        sweep = []
        for concurrency in settings.load_concurrency or [4, 16, 64, 256]:
            for client in ("raw", "httpx") if settings.httpx_reference else ("raw",):
                sweep.append(saturation(urls, procs, requests, concurrency, settings.saturation_seconds, client))
        harness.print_table(
            ["client", "concurrency", "episodes", "errors", "episodes/s"],
            [[s["client"], s["concurrency"], s["episodes"], s["errors"], s["episodes_per_s"]] for s in sweep],
            title="server saturation sweep (plain load generator)",
        )
        raw = [s for s in sweep if s["client"] == "raw"]
        best = max(raw, key=lambda s: s["episodes_per_s"])["concurrency"] // len(urls)
        runs = []
        for num_envs in settings.num_envs:
            runs.append(measure(urls, procs, rows, requests, best, num_envs, settings))
    harness.print_table(
        ["num_envs", "episodes", "errors", "episodes/s", "saturation/s", "ratio", "step median s",
         "CPU ms/ep: env", "server", "loadgen", "server (loadgen)"],
        [[r["num_envs"], r["episodes"], r["errors"], r["episodes_per_s"], r["saturation_episodes_per_s"],
          r["ratio"], r["step_s_median"], r["env_cpu_s_per_episode"] * 1000, r["server_cpu_s_per_episode"] * 1000,
          r["load_client_cpu_s_per_episode"] * 1000, r["load_server_cpu_s_per_episode"] * 1000]
         for r in runs],
        title="vector env throughput vs server saturation (same run)",
    )
    results = {
        "settings": {k: (v.name if isinstance(v, Path) else v) for k, v in vars(settings).items()},
        "server": harness.SERVER,
        "saturation_sweep": sweep,
        "load_concurrency": best,
        "runs": runs,
        "target": {"ratio_at_num_envs_ge_256": 0.8},
    }
    path = harness.write_results(settings.name, results, settings.out)
    print(f"\nwrote {path}")
    if settings.plot:
        plot(runs, settings.out / f"{settings.name}.png")
    return results


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Episodes/s and saturation against num_envs (log scale); skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return
    xs = [r["num_envs"] for r in runs]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top.plot(xs, [r["episodes_per_s"] for r in runs], "o-", label="vector env")
    top.plot(xs, [r["saturation_episodes_per_s"] for r in runs], "s--",
             label="server saturation (plain load generator)")
    top.set_ylabel("episodes / s (medians)")
    top.set_title(f"{harness.SERVER}: vector env vs server saturation, same run")
    top.legend()
    bottom.plot(xs, [r["ratio"] for r in runs], "o-", color="C2", label="vector / saturation (median of rounds)")
    bottom.axhline(0.8, color="grey", linestyle=":", label="target 0.8")
    bottom.set_ylim(0, max(1.3, max(r["ratio"] for r in runs) * 1.1))
    bottom.set_ylabel("ratio")
    bottom.set_xlabel("num_envs")
    bottom.legend(loc="lower right")
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
