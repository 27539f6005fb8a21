"""The request-path benchmark drives both sides (here: this checkout twice) and writes its figures (no speed is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_request_path_measures_each_side_in_turns(tmp_path):
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "request_path.py"), "--before", str(REPO), "--rounds", "1",
         "--seconds", "1", "--concurrency", "8", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "request_path.json").read_text())
    runs = results["runs"]["example_multi_step"]
    assert sorted(runs) == ["before", "this checkout"]
    for side in runs.values():
        (run,) = side
        assert run["episodes"] > 0 and run["errors"] == 0 and run["server_cpu_ms_per_episode"] > 0
