"""The throughput benchmark runs end to end and writes sane results (no speed is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_throughput_benchmark_quick_with_64_envs(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "throughput.py"), "--quick", "--num-envs", "64", "--out", str(tmp_path),
         "--no-plot"],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "vector env throughput vs server saturation" in done.stdout  # the table was printed
    results = json.loads((tmp_path / "throughput.json").read_text())
    assert results["benchmark"] == "throughput" and results["machine"]["cpus"] >= 1
    assert all(s["errors"] == 0 and s["episodes"] > 0 for s in results["saturation_sweep"])
    (run,) = results["runs"]
    assert run["num_envs"] == 64
    assert run["episodes"] > 0 and run["errors"] == 0 and run["load_errors"] == 0
    assert run["mean_reward"] == 1.0  # the scripted player plays every task correctly
    assert run["episodes_per_s"] > 0 and run["saturation_episodes_per_s"] > 0 and run["ratio"] > 0


SMOKE_SERVERS = ["badge_lookup", "example_multi_step", "example_single_tool_call"]  # tool calls, several steps


def test_local_policy_benchmark_quick(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "local_policy.py"), "--quick", "--concurrency", "1", "4", "--servers",
         *SMOKE_SERVERS, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "tokens/s vs c=1" in done.stdout  # the table was printed
    results = json.loads((tmp_path / "local_policy.json").read_text())
    assert results["benchmark"] == "local_policy" and results["machine"]["cpus"] >= 1
    assert [s["concurrency"] for s in results["summary"]] == [1, 4]
    assert sorted({server for server, _ in results["tasks"]}) == sorted(SMOKE_SERVERS)
    for run in results["runs"]:
        assert run["failed"] == 0 and run["rollouts"] == len(results["tasks"]) and run["output_tokens"] > 0
        assert run["tokens_per_s"] > 0 and run["rollouts_per_s"] > 0
