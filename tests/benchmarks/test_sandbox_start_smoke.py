"""Smoke test of ``benchmarks/sandbox_start.py``: it runs both variants and writes every cell (no speed check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sandbox_start.py"


@pytest.mark.slow
def test_sandbox_start_smoke(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--held", "0", "0.25", "--runs", "2", "--rounds", "1",
                           "--out", str(tmp_path)], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fork / vfork" in done.stdout  # the table
    results = json.loads((tmp_path / "sandbox_start.json").read_text())
    assert [cell["held_gib"] for cell in results["cells"]] == [0, 0.25]
    for cell in results["cells"]:
        assert len(cell["vfork_ms"]) == len(cell["fork_ms"]) == 1 and cell["vfork_median_ms"] > 0
        assert cell["fork_over_vfork"] == pytest.approx(cell["fork_median_ms"] / cell["vfork_median_ms"])
    assert results["machine"]["cpu_flags"] and len(results["machine"]["loadavg_at_start"]) == 3
