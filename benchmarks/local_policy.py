"""The local policy (embedded SmolLM2-135M-Instruct, CPU): tokens/s and rollouts/s at concurrency 1, 8 and 16.

Question: how much do batched turns buy? The same rollouts (2 example tasks of each bundled
server, greedy, ``--max-output-tokens`` per turn) are collected through the real rollout path
(``rollouts.jobs.collect_jobs`` against the launched servers) at each concurrency, with a fresh
policy each time (an empty prefix cache: no level reuses another's work). Levels alternate
within a round, in a rotating order, over ``--rounds`` rounds, so that a shift in the machine's
load hits every level alike. Target: at concurrency 8, >= 4x the tokens/s of concurrency 1.

tokens/s counts generated tokens (the ``output_tokens`` of every rollout's ``response.usage``)
over the level's wall time, prefill included; rollouts/s, finished rollouts over the same time.

Usage::

    python benchmarks/local_policy.py                 # 2 rounds of 1, 8, 16 (about 10 minutes on 2 cores)
    python benchmarks/local_policy.py --quick         # 1 round, 1 task per server, 16 tokens
    python benchmarks/local_policy.py --quick --servers badge_lookup example_multi_step   # a few servers (the CI smoke)

Writes ``benchmarks/results/local_policy.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks-per-server", type=int, default=2)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--threads", type=int, help="torch threads of the policy (default: every available CPU)")
    parser.add_argument("--quick", action="store_true", help="1 round, 1 task per server, 16 tokens a turn")
    parser.add_argument("--servers", nargs="+", metavar="NAME",
                        help="only these bundled servers (default: every one; the CI smoke names three)")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="local_policy")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.tasks_per_server, args.max_output_tokens = 1, 1, 16
    return args


def _tasks(per_server: int, only: list[str] | None = None) -> list[tuple[str, int, dict[str, Any]]]:
    from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers
    from nemo_gym_env.protocol.dataset import load_rows

    names = sorted(bundled_servers())
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise SystemExit(f"--servers: no bundled server named {', '.join(unknown)} (there are: {', '.join(names)})")
    return [(server, index, row) for server in sorted(only or names)
            for index, row in enumerate(load_rows(bundled_dataset(server))[:per_server])]


def _level(concurrency: int, tasks: list, urls: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: every task once at ``concurrency``, with a new policy."""
    from nemo_gym_env.policies.local import LocalPolicy
    from nemo_gym_env.rollouts.jobs import RolloutJob, ServerClients, apply_sampling, collect_jobs
    from nemo_gym_env.rollouts.output import is_failure

    policy = LocalPolicy(temperature=0.0, num_threads=args.threads)
    clients = ServerClients(urls)
    sampling = {"temperature": 0.0, "max_output_tokens": args.max_output_tokens}
    jobs = [RolloutJob(apply_sampling(row, sampling), n, 0, clients[server], policy, server)
            for n, (server, _, row) in enumerate(tasks)]

    async def run() -> list[dict[str, Any]]:
        return [row async for row in collect_jobs(jobs, concurrency=concurrency, max_steps=args.max_steps)]

    load = os.getloadavg()[0]
    started = time.perf_counter()
    rows = asyncio.run(run())
    seconds = time.perf_counter() - started
    policy.close()
    done = [r for r in rows if not is_failure(r)]
    output_tokens = sum(r["response"]["usage"]["output_tokens"] for r in done)
    input_tokens = sum(r["response"]["usage"]["input_tokens"] for r in done)
    stats = policy.stats
    return {
        "concurrency": concurrency, "rollouts": len(done), "failed": len(rows) - len(done), "seconds": seconds,
        "output_tokens": output_tokens, "input_tokens": input_tokens, "tokens_per_s": output_tokens / seconds,
        "rollouts_per_s": len(done) / seconds, "mean_reward": statistics.fmean(r["reward"] for r in done) if done else 0,
        "turns": stats["rows"], "steps": stats["steps"], "mean_batch": stats["mean_batch"],
        "prefill_seconds": stats["prefill_seconds"], "step_seconds": stats["step_seconds"],
        "ms_per_step": 1000 * stats["step_seconds"] / max(stats["steps"], 1), "policy_stats": stats, "loadavg_1m_before": load,
        "loadavg_1m_after": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    tasks = _tasks(args.tasks_per_server, args.servers)
    servers = sorted({server for server, _, _ in tasks})
    runs: list[dict[str, Any]] = []
    with Launcher() as launcher:
        urls = {p.name: p.url for p in launcher.start_all([bundled_spec(name) for name in servers])}
        for round_ in range(args.rounds):
            order = args.concurrency[round_ % len(args.concurrency):] + args.concurrency[: round_ % len(args.concurrency)]
            for concurrency in order:
                result = _level(concurrency, tasks, urls, args)
                runs.append({"round": round_, **result})
                print(f"round {round_} concurrency {concurrency:>2}: {result['tokens_per_s']:.1f} tokens/s, "
                      f"{result['rollouts_per_s']:.3f} rollouts/s, {result['seconds']:.0f} s, mean batch "
                      f"{result['mean_batch']:.1f}, {result['ms_per_step']:.0f} ms a step, prefill "
                      f"{result['prefill_seconds']:.0f} s, load {result['loadavg_1m_before']:.1f}", flush=True)

    base = args.concurrency[0]
    summary = []
    for concurrency in args.concurrency:
        mine = [r for r in runs if r["concurrency"] == concurrency]
        ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r in mine for b in runs
                  if b["concurrency"] == base and b["round"] == r["round"]]
        summary.append({
            "concurrency": concurrency,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
            "rollouts_per_s": statistics.median(r["rollouts_per_s"] for r in mine),
            "seconds": statistics.median(r["seconds"] for r in mine),
            "mean_batch": statistics.median(r["mean_batch"] for r in mine),
            "tokens_per_s_ratio": statistics.median(ratios) if ratios else float("nan"),
            "ratio_per_round": ratios,
        })
    harness.print_table(
        ["concurrency", "tokens/s", "rollouts/s", "seconds", "mean batch", f"tokens/s vs c={base}", "per round"],
        [[s["concurrency"], s["tokens_per_s"], s["rollouts_per_s"], s["seconds"], s["mean_batch"],
          s["tokens_per_s_ratio"], " ".join(f"{x:.2f}" for x in s["ratio_per_round"])] for s in summary],
        title=f"local policy (SmolLM2-135M-Instruct, greedy, {args.max_output_tokens} tokens a turn, "
              f"{len(tasks)} rollouts per level, medians of {args.rounds} round(s))",
    )
    settings = {k: v for k, v in vars(args).items() if k != "out"}  # the folder is where it went, not a setting
    path = harness.write_results(args.name, {"settings": settings, "tasks": [[s, i] for s, i, _ in tasks],
                                             "summary": summary, "runs": runs}, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
