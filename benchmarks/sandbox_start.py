"""How long code_gen's sandbox takes to start one test program, by how much memory the server holds.

Question: does starting a sandboxed interpreter cost more when the process that starts it is large?
It does when Python must ``fork()``: the child gets a copy of the parent's page tables, whose size
grows with the parent's resident memory. Python starts a child with ``vfork()`` instead (nothing
copied) only when no ``preexec_fn`` is given, which is why the sandbox sets its resource limits in
the child's bootstrap (``servers/code_gen/sandbox.py``).

Each cell is a fresh process that first makes ``--held`` GiB resident (a server that has loaded
a model, a test process that has run others), then runs a trivial program (read a number, print
its double) ``--runs`` times through ``Sandbox.run``: as the sandbox does it (``vfork``), and
with a no-op ``preexec_fn`` added to the same call (``fork``, what the sandbox did before).
Variants alternate within each size; the table gives milliseconds per run and their ratio.

Usage::

    python benchmarks/sandbox_start.py                  # 0, 1 and 2 GiB held, 40 runs each
    python benchmarks/sandbox_start.py --held 0 1 --runs 10

Writes ``benchmarks/results/sandbox_start.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

CHILD = r"""
import asyncio, json, sys, time
held_gib, runs, variant = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
held = bytearray(int(held_gib * 2**30))
held[::4096] = b"\x01" * len(range(0, len(held), 4096))  # every page resident
from nemo_gym_env.servers.code_gen import sandbox
if variant == "fork":
    spawn = asyncio.create_subprocess_exec
    async def with_preexec(*args, **kwargs):
        return await spawn(*args, preexec_fn=lambda: None, **kwargs)
    asyncio.create_subprocess_exec = with_preexec
async def main():
    box = sandbox.Sandbox(sandbox.Limits(timeout_s=10), max_concurrent=1)
    first = await box.run("print(int(input()) * 2)", stdin="21\n")  # untimed: caches warm
    assert first.kind == "ok" and first.stdout == b"42\n", first
    started = time.perf_counter()
    for _ in range(runs):
        run = await box.run("print(int(input()) * 2)", stdin="21\n")
        assert run.kind == "ok", run
    return (time.perf_counter() - started) / runs * 1000
print(json.dumps({"ms_per_run": asyncio.run(main())}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=float, nargs="+", default=[0, 1, 2], help="GiB the starting process holds")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="sandbox_start")
    return parser.parse_args(argv)


def _cell(held: float, runs: int, variant: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, str(held), str(runs), variant], capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the child process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["ms_per_run"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    cells: dict[float, dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        for held in args.held:
            order = ("vfork", "fork") if round_ % 2 == 0 else ("fork", "vfork")
            for variant in order:
                ms = _cell(held, args.runs, variant)
                cells.setdefault(held, {}).setdefault(variant, []).append(ms)
                print(f"  round {round_ + 1}, {held:g} GiB held, {variant}: {ms:.1f} ms a run", flush=True)
    rows, table = [], []
    for held in args.held:
        cell = cells[held]
        vfork, fork = harness.median(cell["vfork"]), harness.median(cell["fork"])
        rows.append({"held_gib": held, "vfork_ms": cell["vfork"], "fork_ms": cell["fork"],
                     "vfork_median_ms": vfork, "fork_median_ms": fork, "fork_over_vfork": fork / vfork})
        table.append([f"{held:g}", vfork, fork, fork / vfork])
    harness.print_table(["GiB held", "vfork ms/run", "fork ms/run", "fork / vfork"], table,
                        title=f"code_gen sandbox, one trivial program, {args.runs} runs x {args.rounds} rounds")
    path = harness.write_results(args.name, {"settings": {"held_gib": args.held, "runs": args.runs,
                                                          "rounds": args.rounds}, "cells": rows}, args.out)
    print(f"wrote {path}")
    return {"cells": rows}


if __name__ == "__main__":
    main()
