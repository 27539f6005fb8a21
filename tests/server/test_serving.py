"""The server process's side of the launcher (``server.serving``), run as real processes on 127.0.0.1."""

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

from nemo_gym_env import launch

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
    env = {k: v for k, v in os.environ.items() if k != launch.SERVER_ENV}
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
