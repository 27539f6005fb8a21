"""Side by side with NeMo Gym 0.4.0: the same tasks, the same model process, rollouts per second.

In one run:

- one deterministic model process (``benchmarks/scripted_model.py``) that solves NeMo Gym's
  own ``data/example.jsonl`` rows of example_single_tool_call, example_session_state_mgmt and
  example_multi_step, serving ``POST /v1/responses``;
- NeMo Gym's own stack from the interop virtualenv (``scripts/interop_venv.sh``; found as
  ``tests/interop`` finds it): one ``ng_run`` with its three resources servers, one
  ``openai_model`` in front of the model process and one ``simple_agent`` per server, driven by
  ``ng_collect_rollouts`` (``+num_samples_in_parallel`` = the concurrency);
- ours: ``nemo-gym-env rollouts SERVER --input <their example.jsonl> --policy openai`` against the
  same model process, and ``--policy scripted`` (the model in-process).

Each measurement is N rollouts (the 5 example rows repeated) at each concurrency. Rollouts/s
over HTTP is measured at the model process, from its first request to its last reply, for both
sides alike; the in-process path is timed around the whole command, start-up included, and, as the
HTTP sides are, over its rollouts alone (its progress line at 100%: from the first rollout, once its
server is up, to the last). Every
rollout of every side must score 1.0 (asserted). Results: ``benchmarks/results/vs_nemo_gym.json``
and ``vs_nemo_gym.png`` (with matplotlib, the ``bench`` extra).

Run: ``python benchmarks/vs_nemo_gym.py [--rollouts 2000] [--concurrency 16 64] [--servers ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for path in (REPO, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import harness  # noqa: E402

from tests.interop.conftest import find_interop_python  # noqa: E402
from tests.interop.ngstack import NgRun, site_packages  # noqa: E402

SERVERS = ["example_single_tool_call", "example_session_state_mgmt", "example_multi_step"]
MODEL_INSTANCE = "bench_policy_model"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def their_rows(sp: Path, server: str) -> Path:
    return sp / "resources_servers" / server / "data" / "example.jsonl"


class ModelProcess:
    """``benchmarks/scripted_model.py`` as a child process; stops when this process closes its stdin."""

    def __init__(self, rows: dict[str, Path]):
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "scripted_model.py"), *(f"{s}={p}" for s, p in rows.items())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        self.base_url = self.process.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise SystemExit("the scripted model process did not start")

    def reset(self) -> None:
        httpx.post(f"{self.base_url}/_timing/reset", timeout=10)

    def span(self) -> tuple[float, int]:
        timing = httpx.get(f"{self.base_url}/_timing", timeout=10).json()
        return timing["last"] - timing["first"], timing["requests"]

    def cpu_s(self) -> float:
        return harness.cpu_seconds(self.process.pid)

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def ng_config(sp: Path, model_url: str, servers: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """NeMo Gym's own resources server blocks, an openai_model at the model process, a simple_agent each."""
    config: dict[str, Any] = {MODEL_INSTANCE: {"responses_api_models": {"openai_model": {
        "entrypoint": "app.py", "openai_base_url": model_url, "openai_api_key": "unused", "openai_model": "scripted",
    }}}}
    agents = {}
    for server in servers:
        blocks = yaml.safe_load((sp / "resources_servers" / server / "configs" / f"{server}.yaml").read_text())
        [(instance, block)] = [(n, b) for n, b in blocks.items() if isinstance(b, dict) and "resources_servers" in b]
        config[instance] = block
        agents[server] = f"bench_{server}_agent"
        config[agents[server]] = {"responses_api_agents": {"simple_agent": {
            "entrypoint": "app.py",
            "resources_server": {"type": "resources_servers", "name": instance},
            "model_server": {"type": "responses_api_models", "name": MODEL_INSTANCE},
        }}}
    return config, agents


def run_theirs(run: NgRun, agent: str, rows: list[dict], repeats: int, concurrency: int, folder: Path) -> list[dict]:
    inputs = folder / f"{agent}-{concurrency}-in.jsonl"
    output = folder / f"{agent}-{concurrency}-out.jsonl"
    inputs.write_text("".join(json.dumps({**row, "agent_ref": {"type": "responses_api_agents", "name": agent}}) + "\n"
                              for _ in range(repeats) for row in rows))
    done = run.run_cli("ng_collect_rollouts", f"+input_jsonl_fpath={inputs}", f"+output_jsonl_fpath={output}",
                       f"+num_samples_in_parallel={concurrency}", timeout_s=3600)
    if done.returncode != 0:
        raise SystemExit(f"ng_collect_rollouts failed: {done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{run.log_tail()}")
    return read_jsonl(output)


def rollouts_phase_rate(stderr: str) -> float | None:
    """Rollouts/s of the command's rollouts alone (its progress line at 100%: from the first rollout's start, once
    the server is up, to the last one's end), None when the line is missing."""
    found = re.findall(r"^rollouts (\d+)/(\d+) +100%  ([\d.]+)/s", stderr, re.MULTILINE)
    return float(found[-1][2]) if found else None


def run_ours(server: str, rows_path: Path, repeats: int, concurrency: int, folder: Path, policy: list[str]) -> tuple[float, list[dict], str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = folder / f"ours-{server}-{policy[1]}-{concurrency}.jsonl"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "nemo_gym_env.cli", "rollouts", server, "--input", str(rows_path), "--num-repeats",
         str(repeats), "--concurrency", str(concurrency), *policy, "-o", str(out), "--no-env-yaml",
         "--first-reply-timeout", "0"],  # the model server is warm: no probe request in the measured span
        env=env, capture_output=True, text=True, timeout=3600, check=False,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"nemo-gym-env rollouts failed: {done.stderr[-3000:]}")
    return wall, read_jsonl(out), done.stderr


def check(side: str, server: str, rows: list[dict], total: int) -> None:
    rewards = [row.get("reward") for row in rows]
    assert len(rows) == total, f"{side} {server}: {len(rows)} rows for {total} rollouts"
    assert all(r == 1.0 for r in rewards), f"{side} {server}: rewards {sorted(set(map(str, rewards)))}"


def plot(results: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = results["runs"]
    concurrencies = sorted({r["concurrency"] for r in runs})
    fig, axes = plt.subplots(1, len(concurrencies), figsize=(6 * len(concurrencies), 4), squeeze=False)
    sides = ["NeMo Gym 0.4.0 (HTTP)", "ours --policy openai (HTTP)", "ours --policy scripted (in-process)"]
    for ax, concurrency in zip(axes[0], concurrencies):
        servers = [r["server"] for r in runs if r["concurrency"] == concurrency and r["side"] == sides[0]]
        width = 0.27
        for i, side in enumerate(sides):
            values = [next((r["rollouts_per_s"] for r in runs if r["concurrency"] == concurrency and r["server"] == s
                            and r["side"] == side), 0.0) for s in servers]
            ax.bar([x + (i - 1) * width for x in range(len(servers))], values, width, label=side)
        ax.set_xticks(range(len(servers)), [s.removeprefix("example_") for s in servers])
        ax.set_ylabel("rollouts/s")
        ax.set_title(f"{results['rollouts']} rollouts, concurrency {concurrency}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000, help="rollouts per server and side (a multiple of 5)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--servers", nargs="+", default=SERVERS, choices=SERVERS)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()
    python, why = find_interop_python()
    if python is None:
        raise SystemExit(f"{why}: build it with scripts/interop_venv.sh")
    sp = site_packages(python)
    rows_paths = {server: their_rows(sp, server) for server in args.servers}
    rows = {server: read_jsonl(path) for server, path in rows_paths.items()}
    repeats = max(1, args.rollouts // 5)
    results: dict[str, Any] = {"rollouts": repeats * 5, "servers": args.servers, "concurrency": args.concurrency,
                               "runs": [], "machine": harness.machine()}
    table = []
    model = ModelProcess(rows_paths)
    with tempfile.TemporaryDirectory(prefix="vs-nemo-gym-") as tmp:
        folder = Path(tmp)
        config, agents = ng_config(sp, model.base_url, args.servers)
        run = NgRun(python, folder / "ng_run", config)
        try:
            started = time.monotonic()
            run.start()
            results["ng_run_start_s"] = time.monotonic() - started
            for concurrency in args.concurrency:
                for server in args.servers:
                    total = repeats * len(rows[server])
                    measured: dict[str, float] = {}
                    for side in ("NeMo Gym 0.4.0 (HTTP)", "ours --policy openai (HTTP)"):
                        model.reset()
                        cpu_before = model.cpu_s()
                        if side.startswith("NeMo"):
                            wall = None
                            out = run_theirs(run, agents[server], rows[server], repeats, concurrency, folder)
                        else:
                            wall, out, _ = run_ours(server, rows_paths[server], repeats, concurrency, folder,
                                                    ["--policy", "openai", "--base-url", model.base_url, "--model",
                                                     "scripted"])
                        span, requests = model.span()
                        check(side, server, out, total)
                        measured[side] = total / span
                        results["runs"].append({"side": side, "server": server, "concurrency": concurrency,
                                                "rollouts_per_s": total / span, "model_span_s": span,
                                                "model_requests": requests, "wall_s": wall,
                                                "model_cpu_ms_per_rollout": 1000 * (model.cpu_s() - cpu_before) / total})
                    side = "ours --policy scripted (in-process)"
                    wall, out, stderr = run_ours(server, rows_paths[server], repeats, concurrency, folder,
                                                 ["--policy", "scripted"])
                    check(side, server, out, total)
                    measured[side] = total / wall
                    phase = rollouts_phase_rate(stderr)
                    results["runs"].append({"side": side, "server": server, "concurrency": concurrency,
                                            "rollouts_per_s": total / wall, "wall_s": wall,
                                            "rollouts_phase_per_s": phase})
                    base = measured["NeMo Gym 0.4.0 (HTTP)"]
                    http, local = measured["ours --policy openai (HTTP)"], measured[side]
                    table.append([server, concurrency, f"{base:.1f}", f"{http:.1f} ({http / base:.2f}x)",
                                  f"{local:.1f} ({local / base:.2f}x)",
                                  f"{phase:.1f} ({phase / base:.2f}x)" if phase else "-"])
                    print(" | ".join(map(str, table[-1])), flush=True)
                    harness.write_results("vs_nemo_gym", {**results, "complete": False}, args.out)  # kept if a later cell fails
        finally:
            run.stop()
            model.close()
    results["loadavg_at_end"] = os.getloadavg()  # "machine" keeps the load at the start
    results["complete"] = True
    harness.print_table(["server", "concurrency", "NeMo Gym rollouts/s", "ours HTTP", "ours in-process (command)",
                         "ours in-process (rollouts)"], table,
                        title=f"{repeats * 5} rollouts each")
    path = harness.write_results("vs_nemo_gym", results, args.out)
    png = path.with_suffix(".png")
    print(f"wrote {path}" + (f" and {png}" if plot(results, png) else " (no matplotlib: no PNG)"))


if __name__ == "__main__":
    main()
