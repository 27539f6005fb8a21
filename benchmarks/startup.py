"""From ``gym.make`` to the first ``reset`` in a fresh process, embedded server included.

Question: how long does a user wait before the first observation? (NeMo Gym builds a
virtualenv per server before the first request: minutes.)

Each run is a new Python process that imports the package, calls
``gym.make("NemoGym/example_multi_step-v0")`` (which starts the bundled server as a
separate process on loopback and waits until it answers) and ``env.reset(seed=0)``, then
closes. The child reports its own timings; the parent also times the whole process.
Several runs, medians. Target: ``gym.make`` to first ``reset`` < 2 s.

Usage::

    python benchmarks/startup.py             # 7 runs
    python benchmarks/startup.py --runs 3

Writes ``benchmarks/results/startup.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import gymnasium as gym
import nemo_gym_env
t1 = time.perf_counter()
env = gym.make(sys.argv[1])
t2 = time.perf_counter()
obs, info = env.reset(seed=0)
t3 = time.perf_counter()
assert obs, "empty first observation"
reset_done = time.time()
env.close()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "make_s": t2 - t1, "first_reset_s": t3 - t2, "make_to_reset_s": t3 - t1,
                  "close_s": t4 - t3, "reset_done_epoch": reset_done}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--env-id", default=f"NemoGym/{harness.SERVER}-v0")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="startup")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    runs = []
    for _ in range(args.runs):
        spawned = time.time()
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, args.env_id], capture_output=True, text=True,
                              timeout=120, check=False)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"the child process failed ({done.returncode}):\n{done.stderr[-3000:]}")
        child = json.loads(done.stdout.strip().splitlines()[-1])
        child["process_start_to_reset_s"] = child.pop("reset_done_epoch") - spawned
        child["process_wall_s"] = wall
        runs.append(child)
        print(f"  make->reset {child['make_to_reset_s']:.2f} s (import {child['import_s']:.2f} s, "
              f"process start->reset {child['process_start_to_reset_s']:.2f} s)", flush=True)
    keys = ["import_s", "make_s", "first_reset_s", "make_to_reset_s", "process_start_to_reset_s", "close_s",
            "process_wall_s"]
    medians = {k: harness.median([r[k] for r in runs]) for k in keys}
    results = {"env_id": args.env_id, "runs": runs, "median": medians, "target": {"make_to_reset_s_below": 2.0}}
    harness.print_table(
        ["phase", "median s", "min s", "max s"],
        [[k, medians[k], min(r[k] for r in runs), max(r[k] for r in runs)] for k in keys],
        title=f"{args.env_id}: {args.runs} fresh processes",
    )
    print(f"\ngym.make -> first reset: median {medians['make_to_reset_s']:.2f} s (target < 2 s)")
    path = harness.write_results(args.name, results, args.out)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
