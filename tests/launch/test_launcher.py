"""The launcher, against real server processes on loopback (fixture servers in tests/fixtures/servers/launch/)."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from nemo_gym_env import launch
from nemo_gym_env.errors import LaunchError, ServerCrashed
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.server import SESSION_SECRET_ENV
from nemo_gym_env.system import child_env
from nemo_gym_env.system.net import answers_ok

from ..conftest import group_members, pid_alive, wait_until
from ..fixtures import fixture_config, fixture_server

FIXTURES = fixture_server("launch")
FIXTURES_YAML = fixture_config("launch")
BUNDLED = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt"]
REPO = Path(__file__).resolve().parents[2]


# ---- fast: no process ---------------------------------------------------------------------------


def test_missing_entrypoint_names_paths_tried(tmp_path, launch_specs):
    spec = dataclasses.replace(
        launch_specs["fixture_ok"], config={"entrypoint": "nope.py"}, config_dir=tmp_path / "configs"
    )
    with Launcher() as launcher, pytest.raises(LaunchError) as err:
        launcher.start(spec)
    message = str(err.value)
    assert "nope.py" in message and str(tmp_path / "nope.py") in message
    assert "resources_servers/launch_fixtures/nope.py" in message


def test_entrypoint_resolution(tmp_path, launch_specs):
    spec = launch_specs["fixture_ok"]
    assert launch.resolve_entrypoint(spec) == (FIXTURES / "ok_app.py").resolve()
    # an absolute entrypoint; NeMo Gym's layout <root>/resources_servers/<impl>/ next to a YAML elsewhere
    absolute = dataclasses.replace(spec, config={"entrypoint": str(FIXTURES / "ok_app.py")}, config_dir=None)
    assert launch.resolve_entrypoint(absolute) == (FIXTURES / "ok_app.py").resolve()
    app = tmp_path / "resources_servers" / "launch_fixtures" / "app.py"
    app.parent.mkdir(parents=True)
    app.write_text("")
    gym_layout = dataclasses.replace(spec, config={"entrypoint": "app.py"}, config_dir=tmp_path / "configs")
    assert launch.resolve_entrypoint(gym_layout) == app.resolve()


# ---- real processes ----------------------------------------------------------------------------


@pytest.mark.slow
def test_start_serves_liveness_and_tool_and_keeps_the_secret_out(launcher, launch_specs):
    proc = launcher.start(launch_specs["fixture_ok"])
    assert proc.url == f"http://127.0.0.1:{proc.port}" and proc.alive() and proc.status == "running"
    assert httpx.get(f"{proc.url}/").json() == {"status": "ok"}
    assert httpx.post(f"{proc.url}/echo", json={"x": 1}).json() == {"echo": {"x": 1}, "name": "fixture_ok"}
    assert launcher.servers == {"fixture_ok": proc}
    environ = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{proc.pid}/environ").read_text().split("\0")
        if "=" in item
    )
    secret = environ[SESSION_SECRET_ENV]
    info = json.loads(environ[child_env.SERVER_ENV])
    assert len(secret) >= 40 and secret not in environ[child_env.SERVER_ENV]
    assert info["name"] == "fixture_ok" and info["config"]["port"] == proc.port
    log = proc.log_path.read_text()
    assert "Application startup complete" in log and secret not in log


@pytest.mark.slow
def test_start_all_parallel_on_distinct_ports(launcher, launch_specs):
    t0 = time.monotonic()
    procs = launcher.start_all([launch_specs["fixture_ok"], launch_specs["fixture_slow"]])
    assert len({p.port for p in procs}) == 2
    for proc in procs:
        assert httpx.get(f"{proc.url}/").status_code == 200
    assert set(launcher.servers) == {"fixture_ok", "fixture_slow"}
    assert time.monotonic() - t0 < 15


@pytest.mark.slow
def test_explicit_port_and_manual_restart(launcher, launch_specs):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = launcher.start(launch_specs["fixture_ok"], port=port)
    assert proc.port == port and proc.url == f"http://127.0.0.1:{port}"
    old_pid = proc.pid
    again = launcher.restart("fixture_ok")
    assert again is proc and proc.port == port and proc.pid != old_pid and proc.restarts == 1
    assert not pid_alive(old_pid)
    assert httpx.get(f"{proc.url}/").status_code == 200
    with pytest.raises(LaunchError, match="already running"):
        launcher.start(launch_specs["fixture_ok"])


@pytest.mark.slow
def test_crash_at_start_raises_with_log_tail(launcher, launch_specs):
    with pytest.raises(ServerCrashed) as err:
        launcher.start(launch_specs["fixture_crash"])
    assert err.value.name == "fixture_crash" and err.value.returncode == 1
    assert "model weights not found at /nowhere" in err.value.log_tail
    assert "server 'fixture_crash' exited with code 1 during start-up" in str(err.value)
    assert launcher.servers == {}


@pytest.mark.slow
def test_never_ready_times_out_and_is_stopped(launch_specs):
    with Launcher(ready_timeout_s=2.0) as launcher:
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as err:
            launcher.start(launch_specs["fixture_hang"])
        assert time.monotonic() - t0 < 8
        message = str(err.value)
        assert "fixture_hang" in message and "http://127.0.0.1:" in message and "2 s" in message
        assert "loading forever" in message and "ready_timeout_s" in message
        assert launcher.servers == {}


@pytest.mark.slow
def test_stop_leaves_no_process(launcher, launch_specs):
    proc = launcher.start(launch_specs["fixture_ok"])
    pid = proc.pid
    assert group_members(pid) == [pid]
    launcher.stop("fixture_ok")
    assert not pid_alive(pid) and group_members(pid) == []
    assert proc.status == "stopped" and launcher.servers == {}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{proc.url}/", timeout=2)
    with pytest.raises(KeyError):
        launcher.stop("fixture_ok")
    launcher.close()
    launcher.close()  # idempotent


@pytest.mark.slow
def test_garbage_collected_launcher_stops_its_servers(launch_specs):
    launcher = Launcher(auto_restart=True)
    pid = launcher.start(launch_specs["fixture_ok"]).pid
    del launcher
    gc.collect()
    assert wait_until(lambda: not pid_alive(pid), 10)


PARENT_SCRIPT = """
import sys, time
from nemo_gym_env.launch.config import load_config, server_specs
from nemo_gym_env.launch import Launcher

spec = server_specs(load_config([{yaml!r}], env_yaml=None))[0]
launcher = Launcher()
proc = launcher.start(spec)
print(proc.pid, flush=True)
if sys.argv[1] == "sleep":
    time.sleep(120)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_no_orphan_when_parent_dies(tmp_path, how):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT_SCRIPT.format(yaml=str(FIXTURES_YAML))))
    parent = subprocess.Popen(
        [sys.executable, str(script), "sleep" if how == "sigkill" else "exit"],
        stdout=subprocess.PIPE,
        cwd=REPO,
        text=True,
    )
    try:
        child = int(parent.stdout.readline())
        if how == "sigkill":
            assert pid_alive(child)
            parent.send_signal(signal.SIGKILL)  # no atexit: the pipe EOF must stop the child
        parent.wait(timeout=20)
        assert wait_until(lambda: not group_members(child), 10), "server outlived its launcher"
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.slow
def test_auto_restart_serves_again_on_the_same_port(launch_specs):
    with Launcher(auto_restart=True) as launcher:
        proc = launcher.start(launch_specs["fixture_ok"])
        url, old_pid = proc.url, proc.pid
        os.kill(old_pid, signal.SIGKILL)
        # The parent keeps the listening socket: this request waits in the backlog, then succeeds.
        assert httpx.get(f"{url}/", timeout=20).json() == {"status": "ok"}
        assert proc.restarts == 1 and proc.pid != old_pid and proc.url == url and proc.alive()
        assert "restart #1" in proc.log_path.read_text()


@pytest.mark.slow
def test_auto_restart_gives_up_on_a_crash_loop(launch_specs, monkeypatch):
    monkeypatch.setattr("nemo_gym_env.launch.launcher.MAX_CRASHES", 1)
    with Launcher(auto_restart=True) as launcher:
        proc = launcher.start(launch_specs["fixture_ok"])
        proc.entrypoint = launch.resolve_entrypoint(launch_specs["fixture_crash"])  # every restart now crashes
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_until(lambda: proc.status == "failed", 15)
        assert proc.restarts == 1 and "giving up" in proc.log_path.read_text()
        with pytest.raises(httpx.ConnectError):  # the parent let go of the socket
            httpx.get(f"{proc.url}/", timeout=2)


@pytest.mark.slow
def test_log_file_and_stream_logs(tmp_path, launch_specs, capsys):
    with Launcher(log_dir=tmp_path, stream_logs=True) as launcher:
        proc = launcher.start(launch_specs["fixture_ok"])
        assert proc.log_path == tmp_path / "fixture_ok.log"
        assert wait_until(lambda: "[fixture_ok] INFO:" in capsys.readouterr().err, 5)
        assert "Application startup complete" in proc.log_tail(5)
    assert (tmp_path / "fixture_ok.log").is_file()  # a given log_dir is kept


@pytest.mark.slow
def test_while_starting_runs_after_the_spawn_and_before_readiness(launcher, launch_specs):
    seen = []

    def meanwhile():
        proc = launcher.servers["fixture_ok"]
        seen.append((proc.status, proc.alive()))

    proc = launcher.start(launch_specs["fixture_ok"], while_starting=meanwhile)
    assert seen == [("starting", True)] and proc.status == "running"
    assert httpx.get(f"{proc.url}/").status_code == 200


@pytest.mark.slow
def test_while_starting_that_raises_stops_the_server(launcher, launch_specs):
    pids = []

    def meanwhile():
        pids.append(launcher.servers["fixture_ok"].pid)
        raise RuntimeError("no luck")

    with pytest.raises(RuntimeError, match="no luck"):
        launcher.start(launch_specs["fixture_ok"], while_starting=meanwhile)
    assert launcher.servers == {} and group_members(pids[0]) == []


def test_readiness_probe_reads_the_status_line():
    """``_answers_ok`` (the readiness check) against raw sockets: 200 only, anything else is not ready."""

    def serve_once(reply: bytes | None) -> tuple[socket.socket, list[bytes]]:
        server = socket.create_server(("127.0.0.1", 0))
        got: list[bytes] = []

        def run():
            conn, _ = server.accept()
            with conn:
                got.append(conn.recv(4096))
                if reply is not None:
                    conn.sendall(reply)

        threading.Thread(target=run, daemon=True).start()
        return server, got

    for reply, ready in [(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", True),
                         (b"HTTP/1.1 503 Service Unavailable\r\n\r\n", False),
                         (b"garbage", False), (b"", False)]:
        server, got = serve_once(reply)
        with server:
            assert answers_ok("127.0.0.1", server.getsockname()[1], 2.0) is ready
        assert got and got[0].startswith(b"GET / HTTP/1.1\r\nHost: 127.0.0.1:")
    with socket.create_server(("127.0.0.1", 0)) as server:  # listening, never answering: times out
        assert answers_ok("127.0.0.1", server.getsockname()[1], 0.2) is False
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    assert answers_ok("127.0.0.1", port, 1.0) is False  # refused


@pytest.mark.slow
def test_every_bundled_server_starts(launcher):
    procs = launcher.start_all([bundled_spec(name) for name in BUNDLED])
    assert [p.name for p in procs] == BUNDLED
    for proc in procs:
        assert httpx.get(f"{proc.url}/").json() == {"status": "ok"}
