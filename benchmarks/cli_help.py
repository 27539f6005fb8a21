"""How long ``nemo-gym-env --help`` and ``nemo-gym-env rollouts --help`` take, in fresh processes.

Question: does the command line answer at once? Each command owns its arguments in its own module
(``nemo_gym_env/cli/``), imported only when that command is named; this measures what that costs or
saves against another checkout of the package (``--before DIR``, e.g. a ``git worktree`` of an older
commit), the two taken in turns in one run so that both see the same machine.

Usage::

    python benchmarks/cli_help.py                          # this checkout, 15 runs of each command
    git worktree add /tmp/before <commit> && python benchmarks/cli_help.py --before /tmp/before

Writes ``benchmarks/results/cli_help.json``: per command and checkout, the median and the spread of the
wall time of the whole process (interpreter start included), and the ratio after / before.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {"--help": ["--help"], "rollouts --help": ["rollouts", "--help"], "list": ["list", "--json"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", type=Path, help="another checkout of the package, timed in turns with this one")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="cli_help")
    return parser.parse_args(argv)


def _time(checkout: Path, words: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "nemo_gym_env.cli", *words], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: nemo-gym-env {' '.join(words)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds


def _commit(checkout: Path) -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True,
                          check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=checkout,
                           capture_output=True, text=True, check=False).stdout.strip()
    return (done.stdout.strip() + ("+changes" if dirty else "")) if done.returncode == 0 else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    checkouts = {"this": REPO, **({"before": args.before.resolve()} if args.before else {})}
    times: dict[str, dict[str, list[float]]] = {c: {k: [] for k in COMMANDS} for c in checkouts}
    for name, words in COMMANDS.items():  # one warm-up each: the files in the page cache, .pyc written
        for checkout in checkouts.values():
            _time(checkout, words)
    for _ in range(args.runs):
        for name, words in COMMANDS.items():
            for label, checkout in checkouts.items():  # in turns: a drift in the machine's load hits both
                times[label][name].append(_time(checkout, words))
    summary: dict[str, Any] = {}
    rows = []
    for name in COMMANDS:
        entry = {label: {"median_s": harness.median(times[label][name]), "min_s": min(times[label][name]),
                         "max_s": max(times[label][name])} for label in checkouts}
        if "before" in entry:
            entry["ratio_this_over_before"] = entry["this"]["median_s"] / entry["before"]["median_s"]
        summary[name] = entry
        rows.append([f"nemo-gym-env {name}", *(entry[label]["median_s"] for label in checkouts),
                     *([entry["ratio_this_over_before"]] if "before" in entry else [])])
    headers = ["command", *(f"{label} median s" for label in checkouts), *(["this / before"] if args.before else [])]
    harness.print_table(headers, rows, title=f"fresh processes, {args.runs} runs each")
    commits = {label: _commit(checkout) for label, checkout in checkouts.items()}
    path = harness.write_results(args.name, {"runs": args.runs, "commits": commits, "commands": summary,
                                             "times": times}, args.out)
    print(f"wrote {path}")
    return summary


if __name__ == "__main__":
    main()
