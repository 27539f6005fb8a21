"""``rollouts`` with the model policies: an OpenAI-compatible endpoint (a fake one on loopback) and the local model."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nemo_gym_env.rollouts.output import failures_path, metrics_path

from .conftest import CANARY, read_jsonl, run_cli

pytestmark = pytest.mark.slow

ONE = "example_single_tool_call"


class _FakeResponsesAPI(BaseHTTPRequestHandler):
    """``POST /<mode>/v1/responses``: ``ok`` plays get_weather then answers; ``garbage`` answers HTML."""

    seen_auth: list[str] = []  # noqa: RUF012 - reset by the fixture

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        type(self).seen_auth.append(self.headers.get("authorization", ""))
        if self.path.startswith("/garbage/"):
            return self._reply(b"<html>not an API</html>", "text/html")
        called = any(item.get("type") == "function_call_output" for item in body.get("input", []))
        if called:
            item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "It is cold.", "annotations": []}]}
        else:
            item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
                    "arguments": json.dumps({"city": "Oslo"}), "status": "completed"}
        reply = {"id": "resp_1", "object": "response", "created_at": 0, "model": body.get("model"),
                 "status": "completed", "output": [item], "parallel_tool_calls": True, "tool_choice": "auto",
                 "tools": []}
        self._reply(json.dumps(reply).encode())

    def _reply(self, data: bytes, kind: str = "application/json"):
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeResponsesAPI)
    server.daemon_threads = True
    _FakeResponsesAPI.seen_auth = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_openai_policy_from_env_yaml(fake_endpoint, tmp_path):
    (tmp_path / "env.yaml").write_text(
        f"policy_base_url: {fake_endpoint}/ok/v1\npolicy_api_key: {CANARY}\npolicy_model_name: fake-model\n"
    )
    out = tmp_path / "results" / "openai.jsonl"
    result = run_cli("rollouts", ONE, "--policy", "openai", "--limit", "2", "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out)
    assert len(rows) == 2 and all(r["reward"] == 1.0 for r in rows)
    assert f"Bearer {CANARY}" in _FakeResponsesAPI.seen_auth  # the key reached the endpoint...
    everything = result.stdout + result.stderr + out.read_text() + metrics_path(out).read_text()
    assert CANARY not in everything  # ...and nothing else
    assert "openai:responses:fake-model" in result.stderr


def test_garbage_and_refusing_endpoints_fail_rollouts_not_the_run(fake_endpoint, tmp_path):
    out = tmp_path / "garbage.jsonl"
    result = run_cli("rollouts", ONE, "--policy", "openai", "--base-url", f"{fake_endpoint}/garbage/v1",
                     "--model", "m", "--api-key", CANARY, "--limit", "2", "-o", str(out), "--no-env-yaml")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    failures = read_jsonl(failures_path(out))
    assert len(failures) == 2 and {f["_ng_failure_class"] for f in failures} == {"policy_error"}
    assert CANARY not in result.stdout + result.stderr + failures_path(out).read_text()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "refused.jsonl"
    result = run_cli("rollouts", ONE, "--policy", "openai", "--base-url", f"http://127.0.0.1:{port}/v1",
                     "--model", "m", "--limit", "1", "--turn-timeout", "20", "-o", str(out), "--no-env-yaml")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    [failure] = read_jsonl(failures_path(out))
    assert failure["_ng_failure_class"] in ("policy_error", "policy_timeout")


@pytest.mark.skipif(
    not (importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")),
    reason="the local policy needs torch and transformers",
)
def test_local_policy_short_generations(tmp_path):
    out = tmp_path / "local.jsonl"
    result = run_cli("rollouts", ONE, "--policy", "local", "--limit", "2", "--max-output-tokens", "16",
                     "--max-steps", "3", "--seed", "0", "-o", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out)
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [(0, 0), (1, 0)]
    assert all(isinstance(r["reward"], float) for r in rows)
    assert "policy local:" in result.stderr

    # With no --policy, the local model is the default: the resume is not refused for another policy (the
    # manifest names it). Nothing is left to run, so no model loads and no server starts.
    again = run_cli("rollouts", ONE, "--limit", "2", "--max-output-tokens", "16", "-o", str(out), "--resume",
                    timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"2 rollout(s), 0 to run: {out} holds them all (no model loads, no server starts)" in again.stderr
    assert "loading the local model" not in again.stderr and "server(s)" not in again.stderr, again.stderr
    assert len(read_jsonl(out)) == 2
    other = run_cli("rollouts", ONE, "--policy", "scripted", "--limit", "2", "-o", str(out), "--resume")
    assert other.returncode != 0 and "other settings" in other.stderr, other.stderr[-2000:]
