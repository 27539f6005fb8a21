"""The Gymnasium vector env spread over Ray workers (``RayVectorEnv``) against the local one.

Question: what does splitting a vector env over Ray workers cost and buy? The driver (the
training process, where the policy runs) spends CPU per episode on HTTP, JSON and
``Response`` validation with the local ``NemoGymVectorEnv``; with ``RayVectorEnv`` that work
moves to the workers and the driver only slices actions and joins results, at the price of
one Ray call per worker per step.

Same server, same scripted policy (in the driver), same ``num_envs``; the layouts run in
turn, ``--rounds`` times, each for ``--seconds``. The workers run on a two-node Ray cluster
started on this machine (``ray start --head`` and a second ``ray start --address``, each with
``--cpus-per-node`` CPUs, token authentication: the tests' ``LocalCluster``), one CPU each,
``SPREAD`` over the two nodes; ``--private`` uses a private Ray instance instead
(``ray.init(num_cpus=...)``). On a real cluster the workers would be on other machines and the
driver's CPU figure is what stays on the training machine.

Usage::

    python benchmarks/ray_vector.py                    # num_envs 256, workers 1, 2 and 4
    python benchmarks/ray_vector.py --num-envs 64 --workers 1 2 4 --seconds 10

Writes ``benchmarks/results/ray_vector.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' two-node cluster

import harness
from throughput import Settings, run_vector


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--cpus-per-node", type=int, default=2, help="CPUs of each of the two nodes")
    parser.add_argument("--private", action="store_true", help="a private Ray instance instead of two nodes")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the private instance")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="ray_vector")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cluster = None
    if args.private:
        import ray

        # A private instance: "local" never joins a cluster a `ray start` on this machine recorded.
        ray.init(address="local", num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    else:
        from tests.ray_cluster.cluster import LocalCluster, cluster_env

        os.environ.update({k: v for k, v in cluster_env().items() if k != "PYTHONPATH"})  # before ray is imported
        cluster = LocalCluster.start(workers=1, cpus=args.cpus_per_node)
        import ray

    from nemo_gym_env.ray_cluster import RayVectorEnv

    settings = Settings([args.num_envs], min_seconds=args.seconds, max_seconds=args.seconds * 4)
    rows = harness.tasks()
    layouts: dict[str, Any] = {"local": None}
    cpus = 0 if args.private else 1
    for n in args.workers:
        layouts[f"ray x{n}"] = functools.partial(RayVectorEnv, num_workers=n, num_cpus_per_worker=cpus)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in layouts}
    try:
        with harness.launched() as procs:
            urls = [p.url for p in procs]
            for _ in range(args.rounds):
                for name, make_env in layouts.items():
                    server_cpu = harness.cpu_seconds(procs[0].pid)
                    result = run_vector(urls, rows, args.num_envs, settings, make_env=make_env)
                    result["server_cpu_s_per_episode"] = (harness.cpu_seconds(procs[0].pid) - server_cpu) / max(
                        result["episodes"], 1)
                    runs[name].append(result)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.stop()
    table = []
    summary = {}
    for name, results in runs.items():
        rate = harness.median([r["episodes_per_s"] for r in results])
        local_rate = harness.median([r["episodes_per_s"] for r in runs["local"]])
        summary[name] = {
            "episodes": sum(r["episodes"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "episodes_per_s_median": rate,
            "x_local": rate / local_rate,
            "driver_cpu_ms_per_episode_median": 1000 * harness.median([r["env_cpu_s_per_episode"] for r in results]),
            "server_cpu_ms_per_episode_median": 1000 * harness.median([r["server_cpu_s_per_episode"] for r in results]),
            "step_s_median": harness.median([r["step_s_median"] for r in results]),
        }
        s = summary[name]
        table.append([name, s["episodes"], s["errors"], round(rate, 1), round(s["x_local"], 2),
                      round(s["driver_cpu_ms_per_episode_median"], 3), round(s["server_cpu_ms_per_episode_median"], 2),
                      round(s["step_s_median"], 4)])
    harness.print_table(["layout", "episodes", "errors", "episodes/s", "x local", "driver CPU ms/ep",
                         "server CPU ms/ep", "step median s"], table,
                        title=f"RayVectorEnv vs NemoGymVectorEnv, num_envs={args.num_envs}, {args.rounds} rounds, "
                              + ("a private Ray" if args.private else f"2 nodes x {args.cpus_per_node} CPUs"))
    results = {"machine": harness.machine(), "settings": vars(args) | {"out": None}, "summary": summary, "runs": runs}
    print(f"\nwrote {harness.write_results(args.name, results, args.out)}")
    return results


if __name__ == "__main__":
    main()
