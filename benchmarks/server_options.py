"""Which uvicorn options make a resources server faster: HTTP parser and event loop.

Question: what do ``--http httptools`` and ``--loop uvloop`` (uvicorn's ``standard`` extra)
buy a resources server over the pure-Python defaults ``h11`` and ``asyncio``?

Serves ``example_multi_step`` once per option pair, each in its own process running uvicorn
directly (the launcher leaves both options on uvicorn's ``auto``, which picks httptools
and uvloop whenever they are installed), and drives every server in turn, round after
round, with the plain load generator (``loadgen.py``, scripted episodes). Reported per
pair: median episodes/s and the server's CPU milliseconds per episode, the figure that
does not drift with the machine's load.

Usage::

    python benchmarks/server_options.py
    python benchmarks/server_options.py --rounds 5 --seconds 3

Writes ``benchmarks/results/server_options.json``. Pairs whose modules are missing are skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
import loadgen

PAIRS = [("h11", "asyncio"), ("httptools", "asyncio"), ("h11", "uvloop"), ("httptools", "uvloop")]

CHILD = r"""
import socket, sys
import uvicorn
from nemo_gym_env.servers.example_multi_step.app import ExampleMultiStepResourcesServer
fd, http, loop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
app = ExampleMultiStepResourcesServer.from_config({}, "example_multi_step").build_app()
config = uvicorn.Config(app, http=http, loop=loop, log_level="warning", access_log=False, timeout_keep_alive=30)
uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of one load run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="server_options")
    return parser.parse_args(argv)


def _start(http: str, loop: str) -> tuple[subprocess.Popen, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(sock.fileno()), http, loop],
                            pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL)
    sock.close()
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server with http={http} loop={loop} exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/", timeout=1.0, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server with http={http} loop={loop} did not start")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    pairs = [(h, lp) for h, lp in PAIRS
             if (h == "h11" or importlib.util.find_spec(h)) and (lp == "asyncio" or importlib.util.find_spec(lp))]
    requests = [harness.scripted_requests(row) for row in harness.tasks()]
    servers = {pair: _start(*pair) for pair in pairs}
    runs: dict[str, list[dict[str, Any]]] = {f"{h}+{lp}": [] for h, lp in pairs}
    try:
        for (h, lp), (proc, url) in servers.items():  # warm-up
            loadgen.run_load(url, requests, concurrency=args.concurrency, duration_s=1.0)
        for round_ in range(args.rounds):
            for (h, lp), (proc, url) in servers.items():
                cpu = harness.cpu_seconds(proc.pid)
                result = loadgen.run_load(url, requests, concurrency=args.concurrency, duration_s=args.seconds)
                server_cpu = harness.cpu_seconds(proc.pid) - cpu
                runs[f"{h}+{lp}"].append({
                    **result.summary(),
                    "server_cpu_ms_per_episode": 1000 * server_cpu / max(result.episodes, 1),
                    "p50_request_ms": 1000 * harness.percentile(result.latencies_s, 50),
                })
            print(f"  round {round_ + 1}/{args.rounds} done", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(10)
    summary = {
        name: {
            "episodes_per_s": harness.median([r["episodes_per_s"] for r in rs]),
            "server_cpu_ms_per_episode": harness.median([r["server_cpu_ms_per_episode"] for r in rs]),
            "errors": sum(r["errors"] for r in rs),
        }
        for name, rs in runs.items()
    }
    base = summary.get("h11+asyncio")
    harness.print_table(
        ["http+loop", "episodes/s (median)", "x h11+asyncio", "server CPU ms/episode", "errors"],
        [[name, s["episodes_per_s"], s["episodes_per_s"] / base["episodes_per_s"] if base else float("nan"),
          s["server_cpu_ms_per_episode"], s["errors"]] for name, s in summary.items()],
        title=f"example_multi_step under the plain load generator ({args.concurrency} concurrent episodes)",
    )
    results = {"concurrency": args.concurrency, "rounds": args.rounds, "summary": summary, "runs": runs}
    path = harness.write_results(args.name, results, args.out)
    print(f"\nwrote {path}")
    return results


if __name__ == "__main__":
    main()
