"""The README's main job, ``nemo-gym-env rollouts`` with no arguments, watched from outside.

Question: where do the main job's wall time, CPU and memory go, and which part is the model's?

The command runs as a user runs it (the embedded local model, the example tasks of every
bundled server that judges its episodes) in a fresh folder. Every ``--interval`` seconds the
watcher reads ``/proc`` for the whole process tree: each process's resident memory (RSS, and PSS, which counts a shared page once;
a process's peak is the kernel's high-water mark, ``VmHWM``, which no sample misses) and
CPU time, and for the command's own process the CPU time of each thread: its main thread runs
the event loop (episodes, HTTP, JSON: ours), every other thread is the model (the decoding
worker and torch's threads). The rows of ``results/rollouts.jsonl`` are counted as they appear:
the completion rate over time, and the tail (how long the last rollouts ran after the rest).

Usage::

    python benchmarks/main_job.py                     # the README's command, model cache as it is
    python benchmarks/main_job.py --fresh-cache       # an empty model cache: download and GGUF conversion too
    python benchmarks/main_job.py --name main_job_before -- --concurrency 8   # extra arguments for the command

Writes ``benchmarks/results/<name>.json`` (default ``main_job``).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

REPO = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--fresh-cache", action="store_true", help="an empty NEMO_GYM_ENV_CACHE (download + conversion)")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="main_job")
    parser.add_argument("extra", nargs="*", help="more arguments for `nemo-gym-env rollouts` (after --)")
    return parser.parse_args(argv)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += _children(p)
    return out


def _stat_cpu(path: str) -> float:
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _name(pid: int) -> str:
    """What a process is: the CLI, or the server whose app it runs."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in args if a)
    for item in environ:
        if item.startswith((b"NEMO_GYM_ENV_SERVER_NAME=", b"NEMO_GYM_SERVER_NAME=")):
            return "server:" + item.split(b"=", 1)[1].decode(errors="replace")
    match = re.search(r"servers/([a-z_]+)/app\.py", text)
    if match:
        return "server:" + match.group(1)
    if "nemo_gym_env.cli" in text or "nemo-gym-env" in text:
        return "cli"
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/\S*", "<temporary folder>", text)  # one name for alike processes
    return re.sub(r"\S*/(\.venv/bin/)", r"\1", text)[:80]  # a venv's python without the machine's path


def _memory_kib(pid: int) -> tuple[int, int, int]:
    """(RSS, PSS, the kernel's high-water mark of RSS since the process started) in KiB. The high-water
    mark (``VmHWM``) is the true peak; a sample of RSS every ``--interval`` misses peaks between samples."""
    rss = pss = hwm = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, pss, hwm


class Watcher:
    """Samples the process tree of one command until it ends."""

    def __init__(self, pid: int, output: Path, interval: float):
        self.pid, self.output, self.interval = pid, output, interval
        self.samples: list[dict[str, Any]] = []
        self.names: dict[int, str] = {}
        self.cpu: dict[int, float] = {}  # last CPU seconds seen per process
        self.peak_rss: dict[int, int] = {}
        self.peak_pss: dict[int, int] = {}
        self.main_thread_cpu = 0.0
        self.other_threads_cpu = 0.0
        self.rows_at: list[float] = []
        self.start = time.monotonic()
        self._stop = threading.Event()

    def run(self) -> None:
        seen_rows = 0
        while not self._stop.is_set():
            now = time.monotonic() - self.start
            tree = _tree(self.pid)
            total_rss = total_pss = 0
            per: dict[str, dict[str, float]] = {}
            for p in tree:
                try:
                    cpu = _stat_cpu(f"/proc/{p}/stat")
                except OSError:
                    continue
                name = self.names.setdefault(p, _name(p))
                rss, pss, hwm = _memory_kib(p)
                total_rss += rss
                total_pss += pss
                self.cpu[p] = cpu
                self.peak_rss[p] = max(self.peak_rss.get(p, 0), rss, hwm)
                self.peak_pss[p] = max(self.peak_pss.get(p, 0), pss)
                per[f"{name}#{p}"] = {"rss_mib": rss / 1024, "cpu_s": cpu}
            main = other = 0.0
            for task in Path(f"/proc/{self.pid}/task").glob("*"):
                try:
                    seconds = _stat_cpu(str(task / "stat"))
                except OSError:
                    continue
                if int(task.name) == self.pid:
                    main = seconds
                else:
                    other += seconds
            if main or other:
                self.main_thread_cpu, self.other_threads_cpu = main, max(other, self.other_threads_cpu)
            try:
                with open(self.output, "rb") as handle:
                    rows = sum(1 for _ in handle)
            except OSError:
                rows = 0
            self.rows_at += [now] * max(0, rows - seen_rows)
            seen_rows = max(seen_rows, rows)
            self.samples.append({"t": round(now, 2), "rows": rows, "tree_rss_mib": total_rss / 1024,
                                 "tree_pss_mib": total_pss / 1024, "processes": len(per),
                                 "cpu_s": sum(v["cpu_s"] for v in per.values())})
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="main-job-"))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONUNBUFFERED"] = "1"
    if args.fresh_cache:
        env["NEMO_GYM_ENV_CACHE"] = str(work / "cache")
    command = [sys.executable, "-m", "nemo_gym_env.cli", "rollouts", *args.extra]
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = Watcher(proc.pid, work / "results" / "rollouts.jsonl", args.interval)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    heard: list[tuple[float, str]] = []  # stderr lines with the time they came

    def listen() -> None:
        for line in iter(proc.stderr.readline, ""):
            heard.append((time.monotonic() - watcher.start, line.rstrip("\n")))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    stdout = proc.stdout.read()
    proc.wait()
    listener.join()
    wall = time.monotonic() - started
    watcher.stop()
    thread.join()
    said = [line for _, line in heard]
    began = next((t for t, line in heard if re.search(r"\d+ rollout\(s\), \d+ to run", line)), None)

    def figure(pattern: str) -> float | None:
        for line in said:
            match = re.search(pattern, line)
            if match:
                return float(match.group(1))
        return None

    rows_at = watcher.rows_at
    n = len(rows_at)
    first_row = rows_at[0] if rows_at else None
    rate_windows = []
    if rows_at:
        edge = 0.0
        while edge < rows_at[-1]:
            count = sum(1 for t in rows_at if edge <= t < edge + 60)
            rate_windows.append({"from_s": edge, "rollouts": count, "per_s": count / 60})
            edge += 60
    by_name: dict[str, dict[str, float]] = {}
    for p, name in watcher.names.items():
        entry = by_name.setdefault(name, {"processes": 0, "cpu_s": 0.0, "peak_rss_mib": 0.0, "peak_pss_mib": 0.0})
        entry["processes"] += 1
        entry["cpu_s"] += watcher.cpu.get(p, 0.0)
        entry["peak_rss_mib"] += watcher.peak_rss.get(p, 0) / 1024
        entry["peak_pss_mib"] += watcher.peak_pss.get(p, 0) / 1024
    servers_cpu = sum(v["cpu_s"] for k, v in by_name.items() if k.startswith("server:"))
    cli_cpu = by_name.get("cli", {}).get("cpu_s", 0.0)
    results = {
        "command": " ".join(["nemo-gym-env", "rollouts", *args.extra]),
        "fresh_cache": args.fresh_cache,
        "returncode": proc.returncode,
        "wall_s": wall,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "model_load_s": figure(r"loaded .* in ([\d.]+) s"),
        "servers_started_s": figure(r"started \d+ server\(s\) in ([\d.]+) s"),
        "rollouts": n,
        "first_row_at_s": first_row,
        "last_row_at_s": rows_at[-1] if rows_at else None,
        "tail_last_2_s": (rows_at[-1] - rows_at[-3]) if n > 2 else None,
        "tail_last_5_s": (rows_at[-1] - rows_at[-6]) if n > 5 else None,
        "tail_last_10pct_s": (rows_at[-1] - rows_at[-max(2, n // 10) - 1]) if n > 2 else None,
        "rate_per_minute": rate_windows,
        "cpu_s": {"total": servers_cpu + cli_cpu, "cli": cli_cpu, "cli_main_thread (ours: event loop)":
                  watcher.main_thread_cpu, "cli_other_threads (the model)": watcher.other_threads_cpu,
                  "servers": servers_cpu},
        "cpu_percent_of_wall": 100 * (servers_cpu + cli_cpu) / wall,
        "cpu_percent_while_rollouts_ran": None,
        "peak_tree_rss_mib": max((s["tree_rss_mib"] for s in watcher.samples), default=0.0),
        "peak_tree_pss_mib": max((s["tree_pss_mib"] for s in watcher.samples), default=0.0),
        "peak_cli_rss_mib": by_name.get("cli", {}).get("peak_rss_mib"),
        # The kernel's own figure once the command is reaped: the largest peak of any process it waited for.
        "peak_rss_largest_process_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "processes": by_name,
        "samples": watcher.samples[::max(1, round(5 / args.interval))],  # every 5 s: the file stays small
        "stdout": stdout[-6000:],
        "stderr_tail": "\n".join(said[-40:]),
    }
    results["rollouts_began_at_s"] = began
    if rows_at and began is not None:
        results["rollouts_ran_s"] = rows_at[-1] - began
        ran = [s for s in watcher.samples if began <= s["t"] <= rows_at[-1]]
        if len(ran) > 1:
            results["cpu_percent_while_rollouts_ran"] = 100 * (ran[-1]["cpu_s"] - ran[0]["cpu_s"]) / (ran[-1]["t"] - ran[0]["t"])
    path = harness.write_results(args.name, results, args.out)
    harness.print_table(["figure", "value"], [[k, v] for k, v in results.items()
                                               if isinstance(v, (int, float, str)) and k not in ("stdout", "stderr_tail")])
    harness.print_table(["process", "n", "cpu s", "peak RSS MiB", "peak PSS MiB"],
                        [[k, v["processes"], v["cpu_s"], v["peak_rss_mib"], v["peak_pss_mib"]] for k, v in sorted(by_name.items())])
    print(stdout[-3000:])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
