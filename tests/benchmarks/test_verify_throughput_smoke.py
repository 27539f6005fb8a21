"""Smoke test of ``benchmarks/verify_throughput.py``: it runs, and its JSON has every field (no speed check)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "verify_throughput.py"
SERVERS = ["example_single_tool_call", "reasoning_gym"]


@pytest.mark.slow
def test_verify_throughput_smoke(tmp_path: Path) -> None:
    out = tmp_path / "verify_throughput.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--seconds",
            "1",
            "--servers",
            ",".join([*SERVERS, "no_such_server"]),
            "--out",
            str(out),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verify/s" in done.stdout  # the table

    results = json.loads(out.read_text())
    assert results["benchmark"] == "verify_throughput"
    assert results["settings"]["seconds"] == 1.0 and results["settings"]["concurrency"] == 64
    assert {"python", "cpu_count"} <= results["machine"].keys()
    servers = results["servers"]
    assert servers["no_such_server"]["status"] == "skipped"

    expected_ok = [s for s in SERVERS if s != "reasoning_gym" or importlib.util.find_spec("reasoning_gym")]
    for name in expected_ok:
        r = servers[name]
        assert r["status"] == "ok", r
        assert r["mode"] == {"example_single_tool_call": "tool", "reasoning_gym": "single_turn"}[name]
        assert r["verifications"] > 0 and r["errors"] == 0, r.get("first_error")
        assert r["verify_per_s"] > 0 and r["elapsed_s"] >= 1.0
        # Correct scripted play earns 1.0, played and replayed.
        assert r["episode_reward_mean"] == 1.0 and r["replay_reward_mean"] == 1.0
        for key in ("verify_latency_ms", "liveness_idle_ms", "liveness_under_load_ms"):
            stats = r[key]
            assert {"p50", "p99", "max", "n"} <= stats.keys()
            assert stats["n"] > 0 and 0 < stats["p50"] <= stats["p99"] <= stats["max"]
        assert r["concurrency"] == 64 and r["rows"] >= 1
        assert "liveness_p99_slowdown" in r and "client_cpu_s" in r and "server_cpu_s" in r
