"""``ray_collect`` on a two-node Ray cluster against single-machine collection, in the same run.

Question: how many rollouts/s does spreading collection over Ray workers give, at 1, 2 and 4
workers, against ``rollouts.collect`` in one process, for a policy that is pure HTTP (scripted)
and for one that spends CPU on every turn (a small model's compute)?

Layout: a two-node cluster started on this machine (``ray start --head`` and a second
``ray start --address``, each with ``--cpus-per-node`` CPUs, token authentication; the tests'
``LocalCluster``), one ``example_multi_step`` server process outside Ray (4 model turns an
episode), the same rows and repeats for every layout. The layouts run in turn, ``--rounds``
times. Two rates per run: over the whole call (worker start-up included: what a short job
sees) and after start-up (the last three quarters of the rows, by arrival; ``ray_collect``
yields rows in order, so they arrive in bursts: take it as a rough figure).

Usage::

    python benchmarks/ray_collect.py                          # workers 1 2 4, 500 rollouts, 2 rounds
    python benchmarks/ray_collect.py --rollouts 100 --rounds 1 --workers 1 2

Writes ``benchmarks/results/ray_collect.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' cluster and picklable players

import harness


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rollouts", type=int, default=500, help="rollouts per run (the rows repeated)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight per worker (and locally)")
    parser.add_argument("--spin-ms", type=float, default=10.0, help="CPU per model turn of the compute policy")
    parser.add_argument("--cpus-per-node", type=int, default=2)
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="ray_collect")
    return parser.parse_args(argv)


def _policies(spin_ms: float) -> dict[str, Any]:
    from nemo_gym_env.policies import ScriptedPolicy
    from tests.ray_cluster.players import TokenPolicyFactory

    return {"scripted (HTTP only)": functools.partial(ScriptedPolicy, harness.SERVER),
            f"{spin_ms:g} ms CPU a turn": TokenPolicyFactory(harness.SERVER, spin_ms=spin_ms)}


def _local(rows: list[dict], factory: Any, url: str, repeats: int, concurrency: int) -> dict[str, Any]:
    from nemo_gym_env.rollouts.jobs import collect

    async def run() -> list[tuple[float, dict]]:
        return [(time.perf_counter(), row) async for row in collect(rows, factory(), url, num_repeats=repeats,
                                                                     concurrency=concurrency)]

    started = time.perf_counter()
    return _figures(started, asyncio.run(run()))


def _ray(rows: list[dict], factory: Any, url: str, repeats: int, concurrency: int, workers: int) -> dict[str, Any]:
    from nemo_gym_env.ray_cluster import ray_collect

    started = time.perf_counter()
    arrived = [(time.perf_counter(), row) for row in ray_collect(rows, factory, url, num_workers=workers,
                                                                 num_repeats=repeats, concurrency=concurrency,
                                                                 timeout_s=900)]
    return _figures(started, arrived)


def _figures(started: float, arrived: list[tuple[float, dict]]) -> dict[str, Any]:
    """End to end (start-up included), and after start-up: the last three quarters of the rows by arrival."""
    ended = arrived[-1][0] if arrived else time.perf_counter()
    quarter = len(arrived) // 4
    after = arrived[quarter][0] if arrived else ended
    rows = [row for _, row in arrived]
    return {"rollouts": len(rows), "failed": sum(1 for row in rows if row.get("_ng_failure_class")),
            "seconds": ended - started, "first_row_s": arrived[0][0] - started if arrived else float("nan"),
            "rollouts_per_s": len(rows) / (ended - started),
            "steady_rollouts_per_s": (len(rows) - quarter) / (ended - after) if ended > after else float("nan"),
            "mean_reward": sum(r.get("reward", 0.0) for r in rows) / max(len(rows), 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from tests.ray_cluster.cluster import LocalCluster, cluster_env

    os.environ.update({k: v for k, v in cluster_env().items() if k != "PYTHONPATH"})  # before ray is imported
    rows = harness.tasks()
    repeats = max(1, args.rollouts // len(rows))
    cluster = LocalCluster.start(workers=1, cpus=args.cpus_per_node)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        with harness.launched() as procs:
            url = procs[0].url
            for _ in range(args.rounds):
                for policy, factory in _policies(args.spin_ms).items():
                    layouts = runs.setdefault(policy, {})
                    layouts.setdefault("one process", []).append(_local(rows, factory, url, repeats, args.concurrency))
                    for n in args.workers:
                        layouts.setdefault(f"ray_collect x{n}", []).append(
                            _ray(rows, factory, url, repeats, args.concurrency, n))
    finally:
        cluster.stop()
    summary: dict[str, dict[str, Any]] = {}
    table = []
    for policy, layouts in runs.items():
        local = harness.median([r["rollouts_per_s"] for r in layouts["one process"]])
        local_steady = harness.median([r["steady_rollouts_per_s"] for r in layouts["one process"]])
        for name, results in layouts.items():
            rate = harness.median([r["rollouts_per_s"] for r in results])
            steady = harness.median([r["steady_rollouts_per_s"] for r in results])
            entry = {"rollouts": sum(r["rollouts"] for r in results), "failed": sum(r["failed"] for r in results),
                     "rollouts_per_s_median": rate, "x_one_process": rate / local,
                     "steady_rollouts_per_s_median": steady, "steady_x_one_process": steady / local_steady,
                     "rollouts_per_s_by_round": [r["rollouts_per_s"] for r in results]}
            summary[f"{policy} / {name}"] = entry
            table.append([policy, name, entry["rollouts"], entry["failed"], round(rate, 1), round(entry["x_one_process"], 2),
                          round(steady, 1), round(entry["steady_x_one_process"], 2)])
    harness.print_table(["policy", "layout", "rollouts", "failed", "rollouts/s", "x one process", "after start-up/s",
                         "x"], table,
                        title=f"ray_collect on 2 nodes x {args.cpus_per_node} CPUs vs one process, {harness.SERVER}, "
                              f"{repeats * len(rows)} rollouts a run, {args.rounds} round(s)")
    results = {"settings": vars(args) | {"out": None, "rollouts_per_run": repeats * len(rows)}, "summary": summary,
               "runs": runs}
    print(f"\nwrote {harness.write_results(args.name, results, args.out)}")
    return results


if __name__ == "__main__":
    main()
