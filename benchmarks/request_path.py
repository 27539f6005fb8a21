"""The server's request path: server CPU per episode, this checkout against another, in turns.

Question: what does one scripted episode cost a resources server (seed, tool calls, verify), and
did a change to the request path make it cheaper? The figure that does not drift with the
machine's load is the server's own CPU time per finished episode; episodes/s is printed beside it.

Each side's server (a bundled server, started by its own checkout's launcher, so with that
checkout's middleware and wire types) is driven in turn, round after round, by the plain load
generator (``loadgen.py``) with the same request bodies. ``--before DIR`` adds a second checkout
(e.g. ``git worktree add /tmp/before <commit>``); without it only this checkout is measured.

Usage::

    python benchmarks/request_path.py
    python benchmarks/request_path.py --before /tmp/before --rounds 5 --seconds 4

Writes ``benchmarks/results/request_path.json``. Profile a side with
``py-spy record -p <server pid> -f raw`` while it runs (the pids are printed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
import loadgen

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import sys
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.launch.launcher import Launcher
with Launcher() as launcher:
    process = launcher.start(bundled_spec(sys.argv[1]))
    print(process.url, process.pid, flush=True)
    sys.stdin.read()
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", nargs="+", default=[harness.SERVER], help="servers the load generator can play")
    parser.add_argument("--before", type=Path, help="another checkout of the package, measured in turns with this one")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="request_path")
    return parser.parse_args(argv)


def _start(root: Path, server: str) -> tuple[subprocess.Popen, str, int]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    holder = subprocess.Popen([sys.executable, "-c", CHILD, server], cwd=root, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    url, pid = holder.stdout.readline().split()
    return holder, url, int(pid)


def _commit(root: Path) -> str:
    """The commit a checkout is at (what the results name it by, not its path)."""
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    sides = {"this checkout": REPO, **({"before": args.before.resolve()} if args.before else {})}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for server in args.servers:
        requests = [harness.scripted_requests(row, server) for row in harness.tasks(server)]
        started = {side: _start(root, server) for side, root in sides.items()}
        print(f"{server}: " + ", ".join(f"{side} pid {pid}" for side, (_, _, pid) in started.items()), flush=True)
        runs[server] = {side: [] for side in sides}
        try:
            for _, url, _ in started.values():  # warm-up
                loadgen.run_load(url, requests, concurrency=args.concurrency, duration_s=1.0)
            for _ in range(args.rounds):
                for side, (_, url, pid) in started.items():
                    cpu = harness.cpu_seconds(pid)
                    result = loadgen.run_load(url, requests, concurrency=args.concurrency, duration_s=args.seconds)
                    if result.errors:
                        raise SystemExit(f"{server} ({side}): {result.errors} errors, first: {result.first_error}")
                    runs[server][side].append({
                        **result.summary(),
                        "server_cpu_ms_per_episode": 1000 * (harness.cpu_seconds(pid) - cpu) / max(result.episodes, 1),
                    })
        finally:
            for holder, _, _ in started.values():
                holder.stdin.close()
                holder.wait(30)
    summary = {server: {side: {key: harness.median([r[key] for r in rs])
                               for key in ("server_cpu_ms_per_episode", "episodes_per_s")}
                        for side, rs in by_side.items()}
               for server, by_side in runs.items()}
    rows = []
    for server, by_side in summary.items():
        for side, figures in by_side.items():
            ratio = (figures["server_cpu_ms_per_episode"] / by_side["before"]["server_cpu_ms_per_episode"]
                     if "before" in by_side else float("nan"))
            rows.append([server, side, figures["server_cpu_ms_per_episode"], ratio, figures["episodes_per_s"]])
    harness.print_table(["server", "side", "server CPU ms/episode (median)", "x before", "episodes/s (median)"], rows,
                        title=f"scripted episodes, {args.concurrency} concurrent, {args.rounds} rounds of {args.seconds:g} s")
    results = {"concurrency": args.concurrency, "rounds": args.rounds, "seconds": args.seconds,
               "before": _commit(args.before) if args.before else None, "summary": summary, "runs": runs}
    path = harness.write_results(args.name, results, args.out)
    print(f"\nwrote {path}")
    return results


if __name__ == "__main__":
    main()
