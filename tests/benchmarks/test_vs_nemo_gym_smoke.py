"""``benchmarks/vs_nemo_gym.py`` and ``benchmarks/openai_policy.py`` run end to end on a tiny N (no speed is asserted).

The side-by-side benchmark needs NeMo Gym 0.4.0's interop virtualenv, found and built as
``tests/interop`` does (``scripts/interop_venv.sh``); without one it skips, or fails under
``NEMO_GYM_INTEROP_REQUIRED=1`` as CI sets it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interop.conftest import (
    BUILD_ENV,
    PYTHON_ENV,
    REQUIRED_ENV,
    build_interop_venv,
    find_interop_python,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SIDES = {"NeMo Gym 0.4.0 (HTTP)", "ours --policy openai (HTTP)", "ours --policy scripted (in-process)"}


def _bench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _interop_python() -> Path:
    python, reason = find_interop_python()
    if python is None and not os.environ.get(PYTHON_ENV) and os.environ.get(BUILD_ENV, "1") != "0":
        failure = build_interop_venv()
        python, reason = find_interop_python()
        reason = f"{reason} ({failure})" if failure else reason
    if python is None:
        message = f"{reason}: the side-by-side benchmark needs NeMo Gym's interop venv (scripts/interop_venv.sh)"
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


@pytest.mark.interop
@pytest.mark.timeout(900)
def test_vs_nemo_gym_tiny(tmp_path):
    _interop_python()
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "vs_nemo_gym.py"), "--rollouts", "5", "--concurrency", "2",
         "--servers", "example_single_tool_call", "example_session_state_mgmt", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=840, check=False, env=_bench_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "vs_nemo_gym.json").read_text())
    assert results["rollouts"] == 5 and results["machine"]["cpus"] >= 1
    runs = results["runs"]
    assert {(r["side"], r["server"]) for r in runs} == {(s, v) for s in SIDES
                                                        for v in ("example_single_tool_call", "example_session_state_mgmt")}
    assert all(r["rollouts_per_s"] > 0 for r in runs)
    for run in runs:
        if "HTTP" in run["side"]:  # both HTTP sides were timed at the same model process
            assert run["model_requests"] >= 5 and run["model_span_s"] > 0
        else:  # the in-process side: the whole command, and its rollouts alone (read off its progress line)
            assert run["rollouts_phase_per_s"] > 0 and run["wall_s"] > 0


def test_openai_policy_benchmark_tiny(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "openai_policy.py"), "--rollouts", "10", "--concurrency", "4",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False, env=_bench_env(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "openai_policy.json").read_text())
    assert [r["policy"] for r in results["runs"]] == ["openai (responses)", "openai (chat)", "scripted (in-process)"]
    assert all(r["rollouts_per_s"] > 0 for r in results["runs"])
    assert all(r["model_requests"] == 2 * 10 for r in results["runs"] if r["policy"].startswith("openai"))
