"""A cold endpoint is not a hung one: ``rollouts --policy openai`` waits once, before the first rollout,
for the endpoint's first reply (``--first-reply-timeout``), and the tight per-turn limits apply after it.

Against the test server (its ``cold-S-`` knob holds every request until S seconds after the first one,
as a server loading its model at its first request does) and against ``transformers serve`` started
cold on the embedded model while both cores are busy.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nemo_gym_env.rollouts.output import failures_path
from tests.cli.conftest import cli_env, read_jsonl, run_cli

pytestmark = pytest.mark.slow


def _rollouts(base_url: str, model: str, out: Path, *more: str) -> subprocess.CompletedProcess:
    return run_cli("rollouts", "example_single_tool_call", "--policy", "openai", "--base-url", base_url,
                   "--model", model, "-o", str(out), "--no-env-yaml", *more, timeout=400)


def test_a_cold_start_longer_than_the_turn_limit_is_waited_out_once(openai_base_url, tmp_path):
    tight = ("--limit", "2", "--concurrency", "2", "--attempt-timeout", "1", "--turn-timeout", "2")
    cold = f"cold-5-{uuid.uuid4().hex[:8]}"  # the first replies come 5 s after the first request
    started = time.monotonic()
    result = _rollouts(openai_base_url, cold, tmp_path / "waited.jsonl", *tight)
    assert result.returncode == 0, result.stderr[-2000:]
    assert time.monotonic() - started < 60
    assert [r["reward"] for r in read_jsonl(tmp_path / "waited.jsonl")] == [1.0, 1.0]
    assert "waiting for the endpoint's first reply (openai:responses:cold-5-" in result.stderr
    answered = next(line for line in result.stderr.splitlines() if "answered its first request in" in line)
    assert 4.5 <= float(answered.rsplit(" in ", 1)[1].split()[0]) < 30, answered

    # Without the wait (0), the same cold start fails every rollout on the per-turn limits.
    cold = f"cold-5-{uuid.uuid4().hex[:8]}"
    result = _rollouts(openai_base_url, cold, tmp_path / "unwaited.jsonl", *tight, "--first-reply-timeout", "0")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "first reply" not in result.stderr
    failures = read_jsonl(failures_path(tmp_path / "unwaited.jsonl"))
    assert len(failures) == 2 and {f["_ng_failure_class"] for f in failures} == {"policy_timeout"}


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_first_reply_timeout_that_cannot_work_is_refused(value, tmp_path):
    result = run_cli("rollouts", "example_single_tool_call", "--policy", "scripted", "--first-reply-timeout", value,
                     "-o", str(tmp_path / "out.jsonl"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"nemo-gym-env: error: --first-reply-timeout must be >= 0 (0: no wait), got {float(value)}" in result.stderr


def _listening(port: int, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"transformers serve did not listen on {port} within {timeout_s:g} s")


def test_transformers_serve_started_cold_on_a_busy_machine(tmp_path, unused_port):
    """`transformers serve` loads the model at its first request; two busy loops hold both cores for the
    first 30 s, its cold start. Every rollout then runs under the default per-turn limits: two at a time,
    as `transformers serve` (no continuous batching) answers one request after another."""
    pytest.importorskip("fastapi")
    from nemo_gym_env.policies.models import default_model_dir

    model = str(default_model_dir())
    port = unused_port
    serve = Path(sys.executable).with_name("transformers")
    server = subprocess.Popen([str(serve), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                              env=cli_env(HF_HUB_OFFLINE="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=tmp_path)
    burn = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
    burners: list[subprocess.Popen] = []
    try:
        _listening(port, server, 120)  # listening, no model loaded yet: cold
        burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(2)]
        out = tmp_path / "rollouts.jsonl"
        result = _rollouts(f"http://127.0.0.1:{port}/v1", model, out, "--api", "chat", "--limit", "3",
                           "--num-repeats", "2", "--concurrency", "2", "--max-output-tokens", "16")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "answered its first request in" in result.stderr, result.stderr[-2000:]
        print(next(line for line in result.stderr.splitlines() if "answered its first request" in line))
        rows = read_jsonl(out)
        assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(t, k) for t in range(3) for k in range(2)]
        assert not failures_path(out).exists() or not read_jsonl(failures_path(out))
    finally:
        for process in [*burners, server]:
            process.terminate()
        for process in [*burners, server]:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
