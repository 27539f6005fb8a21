"""``nemo-gym-env rollouts``: real CLI processes, launched servers, kills and resumes."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers, missing_extra
from nemo_gym_env.protocol.dataset import iter_rows
from nemo_gym_env.rollouts.output import failures_path, metrics_path

from ..conftest import JUDGED
from .conftest import CANARY, CLI, assert_one_line_error, cli_env, descendants, read_jsonl, run_cli, wait_gone

pytestmark = pytest.mark.slow

ONE = "example_single_tool_call"


def _tasks(server: str) -> int:
    return sum(1 for _, row, _ in iter_rows(bundled_dataset(server)) if row is not None)


def _keys(rows: list[dict]) -> list[tuple[int, int]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]


def _playable() -> list[str]:
    """Bundled judged servers with a scripted player whose required extra (config ``requires``) is installed."""
    return [s for s in JUDGED if importlib.util.find_spec(f"nemo_gym_env.servers.{s}.scripted") and not missing_extra(s)]


def test_scripted_rollouts_on_every_bundled_server(tmp_path):
    out = tmp_path / "all.jsonl"
    result = run_cli("rollouts", "--policy", "scripted", "--num-repeats", "2", "-o", str(out), f"+policy_api_key={CANARY}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out)
    servers = _playable()
    # With none named, the hosted envs are left out, named on one line (each plays when named: tests/bridge).
    [left_out] = [line for line in result.stderr.splitlines() if "not run unless named" in line]
    assert all(name in left_out for name in sorted(set(bundled_servers()) - set(JUDGED))), left_out
    assert set(JUDGED) - set(servers) == set(), "every judged server has a scripted player"
    # Each server's tasks are numbered in its own dataset; a rollout is (server, task, repeat).
    expected = {(server, t, r) for server in servers for t in range(_tasks(server)) for r in range(2)}
    assert len(rows) == len(expected) == sum(_tasks(s) for s in servers) * 2
    assert {(r["agent_ref"]["name"], r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows} == expected
    # A judged server's correct play scores 1.0; a hosted env's rows hold its own returns (tests/bridge).
    judged = [r["reward"] for r in rows if r["agent_ref"]["name"] in JUDGED]
    assert judged and all(reward == 1.0 for reward in judged), judged
    assert Counter(r["agent_ref"]["name"] for r in rows) == {s: _tasks(s) * 2 for s in servers}
    assert all("response" in r and r["response"]["output"] for r in rows)  # the /verify reply, episode included
    metrics = json.loads(metrics_path(out).read_text())
    assert metrics["agent_metrics"]["mean/reward"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))
    assert metrics["num_rollouts"] == len(rows) and metrics["num_failed"] == 0
    assert set(metrics["per_server"]) == set(servers)
    assert "mean/reward" in result.stdout and str(out) in result.stdout  # the table and the path
    assert not failures_path(out).exists()
    assert CANARY not in result.stdout + result.stderr + out.read_text()


def _slow_run(out: Path, *extra: str) -> list[str]:
    return [*CLI, "rollouts", ONE, "--policy", "scripted", "--concurrency", "1", "-o", str(out), *extra]


def _wait_rows(out: Path, proc: subprocess.Popen, at_least: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists():
            n = out.read_bytes().count(b"\n")
            if n >= at_least:
                return n
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.02)
    raise AssertionError("the run produced no rows in time")


def test_kill_9_then_resume_has_every_rollout_exactly_once(tmp_path):
    out = tmp_path / "killed.jsonl"
    repeats = 100
    proc = subprocess.Popen(_slow_run(out, "--num-repeats", str(repeats)), env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_rows(out, proc, 30)
    children = descendants(proc.pid)
    proc.kill()
    proc.communicate(timeout=30)
    before = out.read_bytes().count(b"\n")
    assert 30 <= before < _tasks(ONE) * repeats, "the kill did not land mid-run"
    assert wait_gone(children) == set(), "a launched server outlived its killed parent"
    with open(out, "ab") as handle:  # what a kill in the middle of a write leaves
        handle.write(b'{"_ng_task_index": 0, "_ng_rollout_index": 7, "rew')

    result = subprocess.run(_slow_run(out, "--num-repeats", str(repeats), "--resume", "--concurrency", "4"),
                            env=cli_env(), capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torn last line" in result.stderr
    keys = _keys(read_jsonl(out))
    assert len(keys) == len(set(keys)), "duplicated rollouts"
    assert set(keys) == {(t, r) for t in range(_tasks(ONE)) for r in range(repeats)}


def test_ctrl_c_keeps_the_output_valid_and_exits_130(tmp_path):
    out = tmp_path / "interrupted.jsonl"
    proc = subprocess.Popen(_slow_run(out, "--num-repeats", "100"), env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_rows(out, proc, 20)
    children = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "--resume" in stderr
    data = out.read_bytes()
    assert data.endswith(b"\n")
    rows = read_jsonl(out)
    assert 20 <= len(rows) < 500 and len(set(_keys(rows))) == len(rows)
    assert wait_gone(children) == set()

    result = run_cli("rollouts", ONE, "--policy", "scripted", "--num-repeats", "100", "-o", str(out), "--resume")
    assert result.returncode == 0, result.stderr[-2000:]
    keys = _keys(read_jsonl(out))
    assert len(keys) == len(set(keys)) == 500


def test_sigterm_during_collection_exits_143(tmp_path):
    out = tmp_path / "terminated.jsonl"
    proc = subprocess.Popen(_slow_run(out, "--num-repeats", "100"), env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_rows(out, proc, 10)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert all(json.loads(line) for line in out.read_text().splitlines())


def _bad_dataset(path: Path) -> None:
    good = [json.loads(line) for line in bundled_dataset(ONE).read_text().splitlines()[:3]]
    unknown = json.loads(json.dumps(good[1]))
    unknown["responses_create_params"]["temperature"] = "hot"  # unknown keys are kept; values of a wrong type are not
    path.write_text(
        "\n".join(
            [
                json.dumps(good[0]),
                '{"responses_create_params": {"input": "unterminated',
                json.dumps({"prompt": "no responses_create_params here"}),
                json.dumps(unknown),
                "",
                json.dumps(good[2]),
            ]
        )
        + "\n"
    )


def test_bad_rows_are_reported_and_valid_rows_still_run(tmp_path):
    data, out = tmp_path / "bad.jsonl", tmp_path / "bad_out.jsonl"
    _bad_dataset(data)
    result = run_cli("rollouts", "--server", ONE, "--input", str(data), "--policy", "scripted",
                     "--num-repeats", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{data}:2: not JSON" in result.stderr
    assert f"{data}:3: missing 'responses_create_params'" in result.stderr
    assert f"{data}:4: responses_create_params.temperature: " in result.stderr
    assert "Traceback" not in result.stderr
    rows = read_jsonl(out)
    assert sorted(_keys(rows)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["reward"] == 1.0 for r in rows)

    strict_out = tmp_path / "strict.jsonl"
    strict = run_cli("rollouts", "--server", ONE, "--input", str(data), "--policy", "scripted", "--strict",
                     "-o", str(strict_out))
    assert strict.returncode == 1
    assert f"{data}:2:" in strict.stderr and "--strict" in strict.stderr
    assert not strict_out.exists() or not strict_out.read_text()


class _FlakyServer(BaseHTTPRequestHandler):
    """A resources server whose /verify misbehaves as the row's ``mode`` says (``unjudged`` and ``masked``:
    a reply that judged nothing, until ``judging`` is set)."""

    judging = False

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self._reply(200, b'{"status": "ok"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if self.path == "/verify":
            mode = body.get("mode")
            if mode == "garbage":
                return self._reply(200, b"<html>surprise</html>", "text/html")
            if mode == "hang":
                time.sleep(4)
            if mode == "crash":
                return self._reply(500, b"Internal Server Error", "text/plain")
            if mode == "wrong":  # the model's fault: a reward of 0
                return self._reply(200, json.dumps({**body, "reward": 0.0, "failure_kind": "wrong_answer"}).encode())
            if mode in ("unjudged", "masked") and not _FlakyServer.judging:
                verdict = ({"failure_kind": "verify_timeout", "failure_reason": "the checker ran out of time"}
                           if mode == "unjudged" else {"mask_sample": True})
                return self._reply(200, json.dumps({**body, "reward": 0.0, **verdict}).encode())
            return self._reply(200, json.dumps({**body, "reward": 1.0}).encode())
        if self.path == "/get_weather":
            return self._reply(200, json.dumps({"city": body.get("city"), "weather_description": "cold"}).encode())
        self._reply(200, b"{}")

    def _reply(self, status, data, kind="application/json"):
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            pass


def test_failing_server_rollouts_go_to_the_failures_file(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyServer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = json.loads(bundled_dataset(ONE).read_text().splitlines()[0])
        data, out = tmp_path / "flaky.jsonl", tmp_path / "flaky_out.jsonl"
        data.write_text("".join(json.dumps({**base, "mode": m}) + "\n" for m in ("ok", "garbage", "hang", "crash")))
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = run_cli("rollouts", "--server", ONE, "--server-url", url, "--input", str(data), "--policy", "scripted",
                         "--timeout", "1", "-o", str(out), f"--api-key={CANARY}")
    finally:
        server.shutdown()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    rows = read_jsonl(out)
    assert [(r["_ng_task_index"], r["mode"], r["reward"]) for r in rows] == [(0, "ok", 1.0)]
    failures = {f["_ng_task_index"]: f for f in read_jsonl(failures_path(out))}
    assert set(failures) == {1, 2, 3}
    assert all(f["_ng_failure_class"] == "server_error" for f in failures.values())
    assert "not JSON" in failures[1]["failure_reason"]
    assert "no answer within 1 s" in failures[2]["failure_reason"]
    assert "HTTP 500" in failures[3]["failure_reason"]
    metrics = json.loads(metrics_path(out).read_text())
    assert metrics["num_failed"] == 3 and metrics["num_rollouts"] == 1
    assert CANARY not in result.stdout + result.stderr + failures_path(out).read_text()


def _flaky_server() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyServer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_verify_that_judged_nothing_is_a_failure_and_resume_retries_it(tmp_path):
    """A verify timeout or a masked verdict is never a row with reward 0: it goes to the failures file, a resume
    plays it again, and the failures file then holds only what is still failed. A wrong answer stays a reward."""
    server = _flaky_server()
    _FlakyServer.judging = False
    try:
        base = json.loads(bundled_dataset(ONE).read_text().splitlines()[0])
        data, out = tmp_path / "unjudged.jsonl", tmp_path / "unjudged_out.jsonl"
        data.write_text("".join(json.dumps({**base, "mode": m}) + "\n" for m in ("ok", "wrong", "unjudged", "masked")))
        url = f"http://127.0.0.1:{server.server_address[1]}"
        command = ("rollouts", "--server", ONE, "--server-url", url, "--input", str(data), "--policy", "scripted",
                   "--num-repeats", "2", "-o", str(out))
        first = run_cli(*command)
        assert first.returncode == 1, first.stderr[-2000:]
        assert sorted((r["mode"], r["reward"]) for r in read_jsonl(out)) == [("ok", 1.0)] * 2 + [("wrong", 0.0)] * 2
        failures = read_jsonl(failures_path(out))
        assert sorted((f["_ng_task_index"], f["_ng_rollout_index"], f["failure_kind"]) for f in failures) == [
            (2, 0, "verify_timeout"), (2, 1, "verify_timeout"), (3, 0, "masked"), (3, 1, "masked")]
        assert all("reward" not in f and f["response"]["output"] for f in failures)
        reasons = {f["failure_kind"]: f["failure_reason"] for f in failures}  # the file is in completion order
        assert "the checker ran out of time" in reasons["verify_timeout"]
        assert "mask_sample" in reasons["masked"]
        metrics = json.loads(metrics_path(out).read_text())
        assert metrics["num_rollouts"] == 4 and metrics["num_failed"] == 4
        assert metrics["agent_metrics"]["mean/reward"] == 0.5  # 1.0 and the wrong answers' 0.0, nothing else

        still = run_cli(*command, "--resume", "--limit", "3")  # retries task 2 only; task 3 stays failed
        assert still.returncode == 1, still.stderr[-2000:]
        assert sorted(f["_ng_task_index"] for f in read_jsonl(failures_path(out))) == [2, 2, 3, 3]

        _FlakyServer.judging = True  # the verifier works again
        again = run_cli(*command, "--resume")
        assert again.returncode == 0, again.stderr[-2000:]
    finally:
        server.shutdown()
        _FlakyServer.judging = False
    rows = read_jsonl(out)
    assert sorted(_keys(rows)) == [(t, r) for t in range(4) for r in range(2)]  # each exactly once
    assert not failures_path(out).exists()  # nothing is still failed
    assert json.loads(metrics_path(out).read_text())["num_failed"] == 0


def test_refused_server_fails_every_rollout_without_crashing(tmp_path):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "refused.jsonl"
    result = run_cli("rollouts", ONE, "--server-url", f"http://127.0.0.1:{port}", "--policy", "scripted",
                     "--limit", "2", "-o", str(out))
    assert result.returncode == 1
    assert read_jsonl(out) == []
    failures = read_jsonl(failures_path(out))
    assert len(failures) == 2 and all("cannot connect" in f["failure_reason"] for f in failures)
    assert "2 rollout(s) failed" in result.stderr


def test_limit_sampling_overrides_and_output_format(tmp_path):
    out = tmp_path / "limited.jsonl"
    result = run_cli("rollouts", "example_multi_step", "--policy", "scripted", "--limit", "2", "--num-repeats", "3",
                     "--temperature", "0.3", "--top-p", "0.9", "--max-output-tokens", "77", "--max-steps", "8",
                     "-o", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_jsonl(out)
    assert sorted(_keys(rows)) == [(t, r) for t in range(2) for r in range(3)]
    params = rows[0]["responses_create_params"]
    assert (params["temperature"], params["top_p"], params["max_output_tokens"]) == (0.3, 0.9, 77)
    assert list(rows[0])[-4:] == ["_ng_task_index", "_ng_task_key", "_ng_rollout_index", "agent_ref"]


@pytest.mark.parametrize(
    "args",
    [
        ["--num-repeats", "0"],
        ["--concurrency", "0"],
        ["--input", "/no/such/file.jsonl", "--server", ONE],
        ["--server", "no_such_server"],
        ["--server-url", "localhost:1"],
        ["--policy", "openai", "--server", ONE, "--no-env-yaml"],
        ["--policy", "telepathy"],
        ["+config_paths=[/no/such.yaml]"],
    ],
)
def test_bad_arguments_are_one_line_errors(args, tmp_path):
    result = run_cli("rollouts", "--policy", "scripted", *args, "-o", str(tmp_path / "x.jsonl"), cwd=tmp_path)
    assert_one_line_error(result)


def test_components_in_the_table_and_step_rewards_summed_on_request(tmp_path):
    rows = []
    for server, extra in (("instruction_following", {"grading_mode": "fraction"}), ("example_multi_step", {})):
        for _, row, _ in iter_rows(bundled_dataset(server)):
            rows.append({**row, **extra, "agent_ref": {"type": "resources_servers", "name": server}})
    source = tmp_path / "mixed.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out.jsonl"
    result = run_cli("rollouts", "instruction_following", "example_multi_step", "--policy", "scripted",
                     "--input", str(source), "--episode-reward", "sum", "-o", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    written = read_jsonl(out)
    assert len(written) == len(rows)
    following = [r for r in written if r["agent_ref"]["name"] == "instruction_following"]
    multi = [r for r in written if r["agent_ref"]["name"] == "example_multi_step"]
    for row in multi:  # 0.1 per new lookup, added to the /verify reward on request
        assert row["verify_reward"] == 1.0 and row["step_reward_sum"] > 0
        assert row["reward"] == pytest.approx(1.0 + row["step_reward_sum"])
    for row in following:
        assert sum(row["reward_components"].values()) == pytest.approx(row["verify_reward"])
        assert row["step_rewards"] == [0.0] and row["reward"] == row["verify_reward"]
    metrics = json.loads(metrics_path(out).read_text())
    means = metrics["per_server"]["instruction_following"]["reward_components"]
    assert means and metrics["per_server"]["example_multi_step"]["reward_components"] == {}
    name, mean = next(iter(means.items()))
    having = [r["reward_components"][name] for r in following if name in r["reward_components"]]
    assert mean == pytest.approx(sum(having) / len(having))
    assert "reward component" in result.stdout and f"{mean:.3f}" in result.stdout and name in result.stdout


def test_scripted_rollouts_on_the_gymnasium_protocol_server(tmp_path):
    out = tmp_path / "guess.jsonl"
    result = run_cli("rollouts", "guess_number", "--policy", "scripted", "--num-repeats", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out)
    assert len(rows) == _tasks("guess_number") * 2
    assert all(r["reward"] == 1.0 and r["terminated"] and not r["truncated"] for r in rows)
    assert all(r["info"]["result"] == "win" for r in rows)
    # the server's first observation is part of the recorded prompt, as NeMo Gym's agent records it
    assert all(r["responses_create_params"]["input"][-1]["content"].startswith("I am thinking of") for r in rows)
    assert "guess_number" in result.stdout and "1.000" in result.stdout
