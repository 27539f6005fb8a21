"""Any MCP server as a resources server, behind ``gym.make``: mcp-server-time, mcp-server-git on a
temporary repository and mcp-server-fetch on a loopback page (real servers from PyPI, offline),
and the SDK-built fixture ``tally.py`` for the reward tool, HTTP, and the ways a server fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import httpx
import pytest
import yaml

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_time")

import nemo_gym_env  # noqa: F401 - registers the envs
from nemo_gym_env.errors import ServerError
from nemo_gym_env.launch.config import load_config, server_specs
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.server.mcp_upstream import _process_alive  # reads /proc: a zombie is not running
from nemo_gym_env.server.testing import assistant_message, function_call
from tests.conftest import descendants, wait_until
from tests.fixtures import fixture_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

APP = "from nemo_gym_env.server.mcp_bridge import McpResourcesServer\n\nif __name__ == \"__main__\":\n" \
      "    McpResourcesServer.run_webserver()\n"
VERIFY = "from nemo_gym_env.protocol.items import final_answer\n\n\ndef score(row, trajectory):\n" \
         "    calls = sum(1 for item in trajectory if item['type'] == 'function_call')\n" \
         "    return {'reward': float(row['expected_answer'] in final_answer(trajectory)), 'calls': calls}\n"


def server_folder(root: Path, name: str, mcp_server: dict, **keys: object) -> Path:
    """A server folder as a user writes one: the two-line app.py, verify.py and configs/<name>.yaml."""
    folder = root / name
    (folder / "configs").mkdir(parents=True)
    (folder / "app.py").write_text(APP)
    (folder / "verify.py").write_text(VERIFY)
    block = {"entrypoint": "app.py", "mcp_server": mcp_server, "verify": "verify.py:score", **keys}
    config = folder / "configs" / f"{name}.yaml"
    config.write_text(yaml.safe_dump({name: {"resources_servers": {name: block}}}))
    return config


def row(question: str, expected: str, **extra: object) -> dict:
    return {"responses_create_params": {"input": question}, "expected_answer": expected, **extra}


def output(observation: list) -> str:
    return observation[-1]["output"]


# ---- mcp-server-time -------------------------------------------------------------------------


def test_time_server_behind_gym_make(tmp_path):
    config = server_folder(tmp_path, "clock", {"command": "{python}",
                                               "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]})
    rows = [row("It is 09:00 in Tokyo. What time is it in Kolkata?", "05:30")]
    env = gym.make("NemoGym/Generic-v0", config_paths=[str(config)], dataset=rows)
    try:
        env.reset(seed=0)
        base = env.unwrapped.base_url
        schema = httpx.get(f"{base}/openapi.json", timeout=60).json()["paths"]["/convert_time"]["post"]
        body = schema["requestBody"]["content"]["application/json"]["schema"]
        assert set(body["required"]) == {"source_timezone", "time", "target_timezone"}  # the MCP tool's schema
        args = {"source_timezone": "Asia/Tokyo", "time": "09:00", "target_timezone": "Asia/Kolkata"}
        observation, *_ = env.step([function_call(0, 0, "convert_time", args)])
        assert json.loads(output(observation))["target"]["datetime"][11:16] == "05:30"  # the tool's own text
        observation, reward, terminated, truncated, _ = env.step(
            [function_call(1, 0, "convert_time", {**args, "source_timezone": "Mars/Olympus"})])
        assert "Invalid timezone" in json.loads(output(observation))["error"]  # an error output, readable
        assert (reward, terminated, truncated) == (0.0, False, False)
        _, reward, terminated, _, _ = env.step([assistant_message("It is 05:30 in Kolkata.")])
        assert terminated and reward == 1.0 and env.unwrapped.last_verify["calls"] == 2
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step([assistant_message("No idea.")])
        assert terminated and reward == 0.0
    finally:
        env.close()


# ---- mcp-server-git --------------------------------------------------------------------------


def _repository(path: Path) -> Path:
    path.mkdir()
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(path), "PATH": "/usr/bin:/bin"}
    for command in (["git", "init", "-q", "-b", "main"],
                    ["git", "-c", "user.name=Grace Hopper", "-c", "user.email=grace@example.com", "commit", "-q",
                     "--allow-empty", "-m", "Compile the first program"]):
        subprocess.run(command, cwd=path, env=env, check=True, timeout=60)
    return path


def test_git_server_on_a_temporary_repository(tmp_path):
    pytest.importorskip("mcp_server_git")  # the mcp extra; the test extra alone brings time and fetch
    repo = _repository(tmp_path / "repo")
    config = server_folder(tmp_path, "repo_questions", {"command": "{python}",
                                                        "args": ["-m", "mcp_server_git", "--repository", str(repo)]},
                           tools=["git_log", "git_show", "git_status"])
    rows = [row("Who wrote the first commit?", "Grace Hopper")]
    env = gym.make("NemoGym/Generic-v0", config_paths=[str(config)], dataset=rows)
    try:
        env.reset(seed=0)
        routes = httpx.get(f"{env.unwrapped.base_url}/openapi.json", timeout=60).json()["paths"]
        assert {"/git_log", "/git_show", "/git_status"} <= set(routes) and "/git_commit" not in routes  # tools: [...]
        observation, *_ = env.step([function_call(0, 0, "git_log", {"repo_path": str(repo)})])
        assert "Author: Grace Hopper" in output(observation)
        observation, *_ = env.step([function_call(1, 0, "git_log", {"repo_path": "/etc"})])
        assert "outside the allowed repository" in json.loads(output(observation))["error"]
        observation, *_ = env.step([function_call(2, 0, "git_commit", {"repo_path": str(repo), "message": "x"})])
        said = json.loads(output(observation))["error"]  # not a route: left out by the config
        assert said.startswith("Unknown tool 'git_commit': not a tool of this environment"), said
        _, reward, terminated, _, _ = env.step([assistant_message("Grace Hopper wrote it.")])
        assert terminated and reward == 1.0
    finally:
        env.close()


# ---- mcp-server-fetch ------------------------------------------------------------------------


@pytest.fixture
def page_server() -> Iterator[str]:
    """A loopback HTTP server of the test's own: a page with a word on it, and a robots.txt allowing it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            pages = {"/robots.txt": ("text/plain", "User-agent: *\nAllow: /\n"),
                     "/word": ("text/html", ("<html><body><h1>Today</h1><p>The word of the day is "
                                             "<b>marmalade</b>.</p></body></html>"))}
            kind, text = pages.get(self.path, ("text/plain", "not here"))
            self.send_response(200 if self.path in pages else 404)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_server_reads_a_page_from_a_loopback_server(tmp_path, page_server):
    pytest.importorskip("mcp_server_fetch")
    config = server_folder(tmp_path, "reader", {"command": "{python}",
                                                "args": ["-m", "mcp_server_fetch", "--allow-private-ips"]})
    rows = [row(f"What is the word of the day on {page_server}/word ?", "marmalade")]
    env = gym.make("NemoGym/Generic-v0", config_paths=[str(config)], dataset=rows)
    try:
        env.reset(seed=0)
        observation, *_ = env.step([function_call(0, 0, "fetch", {"url": f"{page_server}/word"})])
        assert "marmalade" in output(observation)
        observation, *_ = env.step([function_call(1, 0, "fetch", {"url": f"{page_server}/missing"})])
        assert "404" in json.loads(output(observation))["error"]
        _, reward, terminated, _, _ = env.step([assistant_message("The word is marmalade.")])
        assert terminated and reward == 1.0
    finally:
        env.close()


# ---- the fixture server: the reward tool, isolation, failures --------------------------------


@pytest.fixture(scope="module")
def tally() -> Iterator[tuple[str, int]]:
    """The ``mcp_tally`` resources server, launched once: (URL, pid)."""
    [spec] = server_specs(load_config([fixture_config("mcp_tally")], env_yaml=None))
    with Launcher() as launcher:
        process = launcher.start(spec)
        yield process.url, process.pid


def _tally_env(url: str, rows: list[dict]) -> gym.Env:
    return gym.make("NemoGym/Generic-v0", base_url=url, dataset=rows)


def _add(turn: int, amount: int) -> list[dict]:
    return [function_call(turn, 0, "add", {"amount": amount})]


def test_the_reward_is_the_tool_the_row_names_in_each_sessions_own_server(tally):
    url, _ = tally
    rows = [{"responses_create_params": {"input": "add to five"}},
            {"responses_create_params": {"input": "add to three"},
             "verify_tool": {"name": "score", "arguments": {"target": 3}}}]
    first, second = _tally_env(url, rows), _tally_env(url, rows)
    try:
        first.reset(options={"task_index": 0})
        second.reset(options={"task_index": 1})
        assert output(first.step(_add(0, 2))[0]) == "total=2"
        assert output(second.step(_add(0, 3))[0]) == "total=3"  # its own server: the other's 2 is not here
        assert output(first.step(_add(1, 3))[0]) == "total=5"
        assert first.step([assistant_message("done")])[1] == 1.0  # the config's verify_tool: target 5
        assert second.step([assistant_message("done")])[1] == 1.0  # the row's: target 3
        assert second.unwrapped.last_verify["total"] == 3
        first.reset(options={"task_index": 0})
        assert output(first.step(_add(0, 1))[0]) == "total=1"  # a new session starts from nothing
        assert first.step([assistant_message("done")])[1] == 0.0
    finally:
        first.close()
        second.close()


def test_a_row_never_chooses_the_scoring_tool(tally, tmp_path):
    """A row naming another tool (here one with a side effect that claims 1.0) scores 0 with the refusal as its
    verifier error, and that tool never runs; the config's tool with the row's own ground truth still scores."""
    url, _ = tally
    marker = tmp_path / "dangerous_ran"
    rows = [{"responses_create_params": {"input": "add to five"},
             "verify_tool": {"name": "dangerous", "arguments": {"path": str(marker)}}},
            {"responses_create_params": {"input": "add to five"}, "verify_tool": "dangerous"}]
    for index in range(len(rows)):
        env = _tally_env(url, rows)
        try:
            env.reset(options={"task_index": index})
            env.step(_add(0, 5))  # the config's tool would give 1.0
            _, reward, terminated, truncated, _ = env.step([assistant_message("done")])
            verdict = env.unwrapped.last_verify
        finally:
            env.close()
        assert reward == 0.0 and (terminated or truncated)
        assert verdict["failure_kind"] == "verifier_error"
        assert "may not choose the scoring tool" in verdict["failure_reason"]
    assert not marker.exists()
    # Through the server's own routes too: the tool is not among them (the model cannot call it either).
    assert httpx.post(f"{url}/dangerous", json={"path": str(marker)}, timeout=10).status_code == 404
    assert not marker.exists()


def test_a_hanging_tool_is_an_error_output_and_the_episode_goes_on(tally):
    env = _tally_env(tally[0], [{"responses_create_params": {"input": "x"}}])
    try:
        env.reset(seed=0)
        started = time.monotonic()
        observation, _, terminated, truncated, _ = env.step([function_call(0, 0, "hang", {})])
        assert time.monotonic() - started < 30 and not (terminated or truncated)
        assert "did not answer tool 'hang' within 3 s" in json.loads(output(observation))["error"]
        assert output(env.step(_add(1, 5))[0]) == "total=5"
        assert env.step([assistant_message("done")])[1] == 1.0
    finally:
        env.close()


def test_a_server_that_exits_ends_the_episode_with_the_reason(tally):
    url, server_pid = tally
    env = _tally_env(url, [{"responses_create_params": {"input": "x"}}])
    try:
        env.reset(seed=0)
        mcp_pid = int(output(env.step([function_call(0, 0, "pid", {})])[0]))
        assert mcp_pid in descendants(server_pid)
        _, reward, terminated, truncated, info = env.step([function_call(1, 0, "crash", {})])
        assert truncated and not terminated and reward == 0.0
        assert "exited during tool 'crash'; stderr: tally: crashing on purpose" in info["error"]
    finally:
        env.close()


def test_what_an_upstream_server_starts_ends_with_it_and_a_dead_one_is_gone_not_hung(tally):
    """A tool that starts a child (sleep 600, holding the server's stdout and stderr): the child ends with the
    episode's MCP server at close_session; and when the server itself dies while such a child holds its pipes,
    the next call answers 410 Gone at once (it waited for the pipes: 504 on every call), and the child ends."""
    url = tally[0]
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/seed_session", json={"responses_create_params": {"input": "x"}}).status_code == 200
        child = int(client.post("/spawn_child", json={}).text)
        assert _process_alive(child)
        assert client.post("/close_session", json={}).status_code == 200
        assert wait_until(lambda: not _process_alive(child), 30), "the child outlived close_session"

        assert client.post("/seed_session", json={"responses_create_params": {"input": "x"}}).status_code == 200
        child = int(client.post("/spawn_child", json={}).text)
        server = int(client.post("/pid", json={}).text)
        os.kill(server, signal.SIGKILL)  # the server dies; its child still holds the pipes
        started = time.monotonic()
        assert wait_until(lambda: client.post("/add", json={"amount": 1}).status_code == 410, 20)
        assert time.monotonic() - started < 20  # within the watcher's poll, not a call timeout each time
        assert wait_until(lambda: not _process_alive(child), 30), "the child outlived its dead server"


@pytest.mark.parametrize("mode,message", [("exit", "cannot start: no configuration"),
                                          ("garbage", "did not start within|could not start: .*timed out")])
def test_a_server_that_cannot_start_fails_the_reset_clearly(tally, mode, message):
    env = _tally_env(tally[0], [{"responses_create_params": {"input": "x"}, "mode": mode}])
    try:
        started = time.monotonic()
        with pytest.raises(ServerError, match=message):
            env.reset(seed=0)
        assert time.monotonic() - started < 120
    finally:
        env.close()


def test_routes_refuse_bad_input_and_sessions_that_are_not_theirs(tally):
    url, server_pid = tally
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/add", json={"amount": 1}).status_code == 409  # no seed: no MCP session
        assert client.post("/seed_session", json={"responses_create_params": {"input": "x"}, "mode": "x"}
                           ).status_code == 422  # prepare_session refuses the row
        assert client.post("/seed_session", json={"responses_create_params": {"input": "x"}}).status_code == 200
        pid = int(client.post("/pid", json={}).text)
        reply = client.post("/add", content=b"[1, 2]", headers={"content-type": "application/json"})
        assert reply.status_code == 422 and "JSON object" in reply.json()["error"]
        reply = client.post("/add", content=b"{oops", headers={"content-type": "application/json"})
        assert reply.status_code == 422 and "not JSON" in reply.json()["error"]
        assert client.post("/add", json={"amount": "many"}).status_code == 400  # the tool's own error
        forged = httpx.post(f"{url}/add", json={"amount": 1}, cookies={next(iter(client.cookies)): "forged"},
                            timeout=60)
        assert forged.status_code == 410
        verdict = client.post("/verify", json={"responses_create_params": {"input": "x"}, "response": {
            "id": "r", "created_at": 0, "model": "m", "object": "response", "output": [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}}).json()
        assert verdict["reward"] == 0.0 and verdict["total"] == 0
        # /verify closed the session's MCP server: its process is gone, and the session's tools answer 409
        assert wait_until(lambda: pid not in descendants(server_pid), 30)
        assert client.post("/add", json={"amount": 1}).status_code == 409


def test_abandoned_sessions_are_reaped_with_their_servers(tmp_path):
    override = "++mcp_tally.resources_servers.mcp_tally.session_ttl_s=2"
    [spec] = server_specs(load_config([fixture_config("mcp_tally")], [override], env_yaml=None))
    with Launcher() as launcher, httpx.Client(timeout=60) as client:
        process = launcher.start(spec)
        client.post(f"{process.url}/seed_session", json={"responses_create_params": {"input": "x"}})
        pid = int(client.post(f"{process.url}/pid", json={}).text)
        assert pid in descendants(process.pid)
        # no request at all: the reaper closes the session's MCP server after the idle TTL
        assert wait_until(lambda: pid not in descendants(process.pid), 30)
        assert client.post(f"{process.url}/add", json={"amount": 1}).status_code == 409


def test_an_mcp_server_over_http(tmp_path):
    tally_script = fixture_config("mcp_tally").parent.parent / "tally.py"
    served = subprocess.Popen([sys.executable, str(tally_script), "--http"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(served.stdout.readline().split()[1])
        config = server_folder(tmp_path, "remote", {"url": f"http://127.0.0.1:{port}/mcp"})
        env = gym.make("NemoGym/Generic-v0", config_paths=[str(config)], dataset=[row("add 4", "4")])
        try:
            env.reset(seed=0)
            assert output(env.step(_add(0, 4))[0]).startswith("total=")
            _, reward, terminated, _, _ = env.step([assistant_message("4")])
            assert terminated and reward == 1.0
        finally:
            env.close()
    finally:
        served.terminate()
        served.wait(timeout=30)
