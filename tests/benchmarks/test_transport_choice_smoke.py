"""The transport benchmark plays real episodes on both transports and writes its verdict (no speed is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_transport_choice_runs_both_transports_without_errors(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "transport_choice.py"), "--num-envs", "32", "--rounds", "1",
         "--min-seconds", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Unclosed" not in done.stderr  # every aiohttp session was closed
    results = json.loads((tmp_path / "transport_choice.json").read_text())
    assert sorted(r["transport"] for r in results["runs"]) == ["aiohttp", "builtin"]
    for run in results["runs"]:
        assert run["episodes"] > 0 and run["errors"] == 0 and run["mean_reward"] == 1.0
    (summary,) = results["summary"]
    assert summary["num_envs"] == 32
    assert summary["builtin_cpu_ms_per_episode"] > 0 and summary["aiohttp_cpu_ms_per_episode"] > 0
    assert isinstance(results["aiohttp_within_threshold"], bool)
