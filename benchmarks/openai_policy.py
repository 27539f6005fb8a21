"""``nemo-gym-env rollouts --policy openai`` against one OpenAI-compatible model process, and ``--policy scripted``.

The model process is ``tests/fixtures/openai_server.py`` (deterministic: it calls the task's tool
with the city the user named, then answers with the tool's output, which solves every task of
``example_single_tool_call``). Throughput is measured at the model process: rollouts divided by
the time from its first request to its last reply. The in-process scripted policy is timed
around the whole command (start-up included). Every rollout must score 1.0.

Run: ``python benchmarks/openai_policy.py [--rollouts 2000] [--concurrency 16 64]``; writes
``benchmarks/results/openai_policy.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

from tests.fixtures.openai_server import running_server  # noqa: E402

SERVER = "example_single_tool_call"
TASKS = 5  # rows of the server's example.jsonl


def _rollouts(args: list[str], out: Path) -> tuple[float, list[dict]]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nemo_gym_env.cli", "rollouts", SERVER, *args, "-o", str(out),
                           "--no-env-yaml", "--first-reply-timeout", "0"],  # a warm server: no probe request
                          env=env, capture_output=True, text=True, timeout=3600, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"rollouts failed ({done.returncode}): {done.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return wall, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts per measurement (a multiple of 5)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--apis", nargs="+", default=["responses", "chat"])
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    repeats = max(1, args.rollouts // TASKS)
    total = repeats * TASKS
    results: dict[str, object] = {"server": SERVER, "rollouts": total, "runs": []}
    rows_out = []
    with running_server() as base_url, tempfile.TemporaryDirectory() as tmp:
        for concurrency in args.concurrency:
            common = ["--num-repeats", str(repeats), "--concurrency", str(concurrency)]
            for api in args.apis:
                httpx.post(f"{base_url}/_timing/reset")
                out = Path(tmp) / f"{api}-{concurrency}.jsonl"
                wall, rows = _rollouts(["--policy", "openai", "--base-url", base_url, "--model", "bench",
                                        "--api", api, *common], out)
                timing = httpx.get(f"{base_url}/_timing").json()
                rewards = [r["reward"] for r in rows]
                assert len(rows) == total and all(r == 1.0 for r in rewards), (len(rows), set(rewards))
                span = timing["last"] - timing["first"]
                run = {"policy": f"openai ({api})", "concurrency": concurrency, "rollouts_per_s": total / span,
                       "model_requests": timing["requests"], "model_span_s": span, "wall_s": wall}
                results["runs"].append(run)
                rows_out.append([run["policy"], concurrency, f"{run['rollouts_per_s']:.1f}", f"{wall:.1f}"])
            out = Path(tmp) / f"scripted-{concurrency}.jsonl"
            wall, rows = _rollouts(["--policy", "scripted", *common], out)
            assert len(rows) == total and all(r["reward"] == 1.0 for r in rows)
            run = {"policy": "scripted (in-process)", "concurrency": concurrency, "rollouts_per_s": total / wall,
                   "wall_s": wall}
            results["runs"].append(run)
            rows_out.append([run["policy"], concurrency, f"{run['rollouts_per_s']:.1f}", f"{wall:.1f}"])
    results["machine"] = harness.machine()
    harness.print_table(["policy", "concurrency", "rollouts/s", "command wall s"], rows_out,
                        title=f"{total} rollouts of {SERVER}")
    path = harness.write_results("openai_policy", results, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
