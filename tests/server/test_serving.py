"""The server process's side of the launcher (``server.serving``), run as real processes on 127.0.0.1:
by hand, under a launcher, with two workers, and what its own subprocesses inherit."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nemo_gym_env.launch.catalog import bundled_servers
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import example_rows, function_call
from nemo_gym_env.system import child_env

from ..conftest import group_members, wait_until
from ..fixtures import fixture_server

FIXTURES = fixture_server("launch")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_warns_when_reachable_from_the_network(launcher, launch_specs):
    proc = launcher.start(launch_specs["fixture_ok"], host="0.0.0.0")
    launcher.stop("fixture_ok")
    log = proc.log_path.read_text()
    assert "WARNING" in log and "reachable from the network" in log and "unauthenticated" in log


@pytest.mark.slow
def test_serve_by_hand_without_a_launcher():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env = {k: v for k, v in os.environ.items() if k != child_env.SERVER_ENV}
    env["PYTHONPATH"] = str(REPO)
    child = subprocess.Popen(
        [sys.executable, "ok_app.py", f"port={port}", "name=by_hand"],
        cwd=FIXTURES,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def answers() -> bool:
            try:
                return (
                    httpx.post(f"http://127.0.0.1:{port}/echo", json={}, timeout=1).json()["name"]
                    == "by_hand"
                )
            except httpx.HTTPError:
                return False

        assert wait_until(answers, 20, 0.2)
    finally:
        os.killpg(child.pid, signal.SIGTERM)
        output = child.communicate(timeout=10)[0].decode()
    assert f"http://127.0.0.1:{port}" in output and "reachable from the network" not in output


@pytest.mark.slow
def test_num_workers_two(launcher, launch_specs):
    spec = launch_specs["fixture_ok"]
    spec = dataclasses.replace(spec, config={**spec.config, "num_workers": 2})
    proc = launcher.start(spec)
    with httpx.Client() as client:
        for i in range(8):
            assert client.get(f"{proc.url}/").json() == {"status": "ok"}
            assert client.post(f"{proc.url}/echo", json={"i": i}).json()["echo"] == {"i": i}
    assert wait_until(lambda: len(group_members(proc.pid)) >= 3, 10)  # supervisor + 2 workers (+ tracker)
    launcher.stop("fixture_ok")
    # The leader and workers are reaped by stop(); a SIGKILLed helper (resource tracker) may take a moment.
    assert wait_until(lambda: group_members(proc.pid) == [], 5)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


@pytest.mark.slow
def test_a_bundled_server_run_by_hand_answers():
    folder = bundled_servers()["example_single_tool_call"]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in (child_env.SERVER_ENV, child_env.SESSION_SECRET_ENV)}
    command = [sys.executable, "app.py", "host=127.0.0.1", f"port={port}"]
    child = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def live() -> bool:
            try:
                return httpx.get(f"{url}/", timeout=1).json() == {"status": "ok"}
            except httpx.HTTPError:
                return False

        assert wait_until(live, 60, 0.2), "the server run by hand never answered"
        with httpx.Client(base_url=url, timeout=10) as http:
            row = example_rows(folder)[1]
            assert http.post("/seed_session", json=row).status_code == 200
            weather = http.post("/get_weather", json={"city": "Lisbon"}).json()
            assert weather == {"city": "Lisbon", "weather_description": "The weather in Lisbon is cold."}
            call = function_call(0, 0, "get_weather", {"city": "Lisbon"})
            body = {**row, "response": make_response([call]).model_dump(mode="json")}
            assert http.post("/verify", json=body).json()["reward"] == 1.0
    finally:
        os.killpg(child.pid, signal.SIGTERM)
        output = child.communicate(timeout=20)[0].decode()
    name = "SimpleWeatherResourcesServer"  # the instance is named after the class when run by hand
    assert f"serving {name} ({name}) at {url} with 1 worker(s)" in output
    assert "reachable from the network" not in output


@pytest.mark.slow
def test_two_workers_are_built_from_the_same_class_and_share_sessions(launcher, launch_specs):
    spec = launch_specs["fixture_ok"]
    proc = launcher.start(dataclasses.replace(spec, config={**spec.config, "num_workers": 2}))
    with httpx.Client(base_url=proc.url, timeout=10) as http:
        assert http.post("/seed_session", json={"responses_create_params": {"input": "x"}}).status_code == 200
        cookies = dict(http.cookies)
    assert cookies, "seed_session set no session cookie"
    seen: dict[int, dict] = {}

    def ask_a_new_connection() -> bool:
        reply = httpx.post(f"{proc.url}/whoami", cookies=cookies, timeout=10)
        assert reply.status_code == 200, reply.text  # a worker that could not verify the cookie says 410
        seen[reply.json()["pid"]] = reply.json()
        return len(seen) >= 2

    assert wait_until(ask_a_new_connection, 60, 0.01), f"one worker answered every request: {seen}"
    assert {info["class"] for info in seen.values()} == {"EchoServer"}
    # Each worker imported the class from the entrypoint file itself.
    assert all(info["module"].startswith("_nemo_gym_env_entry_") for info in seen.values())
    assert len({info["session"] for info in seen.values()}) == 1  # one session, whichever worker answers
    assert proc.pid not in seen and set(seen) <= set(group_members(proc.pid))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_the_launchers_variables_do_not_reach_the_servers_subprocesses(launcher, launch_specs, workers):
    spec = launch_specs["fixture_ok"]
    proc = launcher.start(dataclasses.replace(spec, config={**spec.config, "num_workers": workers}))
    reply = httpx.post(f"{proc.url}/child_env", timeout=30).json()
    started_with = _environ(reply["pid"])
    # The process that answered was started with both (the launcher's, or its supervisor's) ...
    assert child_env.SERVER_ENV in started_with and child_env.SESSION_SECRET_ENV in started_with
    # ... and a subprocess it starts gets neither.
    assert "PATH" in reply["names"]
    assert child_env.SERVER_ENV not in reply["names"] and child_env.SESSION_SECRET_ENV not in reply["names"]


def _loaded(pid: int, library: str) -> bool:
    """Whether the process has ``library``'s compiled module mapped (read from /proc)."""
    return any(f"/{library}/" in line for line in Path(f"/proc/{pid}/maps").read_text().splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("http", [None, "httptools", "h11"])
def test_the_http_parser_is_httptools_by_default_and_the_servers_http_key_picks_it(launcher, launch_specs, http):
    spec = launch_specs["fixture_ok"]
    if http is not None:
        spec = dataclasses.replace(spec, config={**spec.config, "http": http})
    proc = launcher.start(spec)
    assert httpx.post(f"{proc.url}/echo", json={}, timeout=10).status_code == 200
    runs = http or "httptools"
    assert _loaded(proc.pid, "httptools") == (runs == "httptools")
    launcher.stop("fixture_ok")
    assert f"http {runs}, loop asyncio" in proc.log_path.read_text()


@pytest.mark.slow
def test_an_http_parser_uvicorn_lacks_is_one_line_at_start(launcher, launch_specs):
    from nemo_gym_env.errors import LaunchError

    spec = launch_specs["fixture_ok"]
    with pytest.raises(LaunchError, match=r"did not start: invalid config: http: Input should be 'auto', 'httptools' or 'h11'"):
        launcher.start(dataclasses.replace(spec, config={**spec.config, "http": "spdy"}))
