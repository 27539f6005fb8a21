"""Run the real NeMo Gym (the interop virtualenv) from the tests: ``ng_run`` and ``ng_collect_rollouts``.

How NeMo Gym 0.4.0 is made to run offline, with nothing but its own launcher:

- ``ng_run`` starts each server as ``cd <server dir> && <venv setup> && python app.py``. The
  venv setup normally builds a uv venv per server from PyPI; with ``skip_venv_if_present=true``
  it only sources ``<uv_venv_dir>/<server_type>/<impl>/.venv/bin/activate`` when that venv
  exists. ``uv_venv_dir`` defaults to the working directory (for a wheel install), so each
  run gets a fresh working directory whose ``.venv`` entries are symlinks to the interop venv.
- A server dir is ``<cwd>/<server_type>/<impl>`` when that holds a ``requirements.txt``, else
  the copy inside the installed wheel: NeMo Gym's own servers run from the wheel, our fixture
  from the working directory.
- ``run_webserver`` calls ``ray.init``. Left alone, ``ng_run`` starts a local Ray cluster
  itself (offline is fine) and hands its address to every server, but with Ray's dashboard
  (about 1 GiB and ten processes), and ``ray.init()`` without an address first joins whatever
  cluster a ``ray start`` on this machine last recorded in ``/tmp/ray/ray_current_cluster``
  (another user's, or a dead one: then it hangs). So each run starts its own small cluster
  (:data:`RAY_HEAD_SCRIPT`: no dashboard, its own ``RAY_TMPDIR`` and auth token) and passes its address as
  NeMo Gym's ``ray_head_node_address``; the cluster stops when our end of its stdin closes,
  even if this process is killed.
- The head server (``GET /server_instances``, ``GET /global_config_dict_yaml``) listens on a
  free port given as ``+head_server={host:127.0.0.1,port:N}``, so runs never collide on 11000.
- Nothing outlives the tests: ``ng_run`` runs under :data:`WATCHDOG_SCRIPT` and the Ray
  cluster under :data:`RAY_HEAD_SCRIPT`, each stopping everything it started when its stdin
  (a pipe from the test process) closes, as it does when the test process dies.
- NeMo Gym's launcher has no notion of a server that is already running: every instance with
  an ``entrypoint`` gets a process. To point NeMo Gym's agent at a server our launcher
  started, the instance gets that server's host and port and, as entrypoint, a stand-in
  script that only waits (:data:`EXTERNAL_SERVER_SCRIPT`); NeMo Gym's readiness check then
  finds our server answering on that port.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

__all__ = ["EXTERNAL_SERVER_SCRIPT", "RAY_HEAD_SCRIPT", "WATCHDOG_SCRIPT", "NgRun", "free_port", "ng_env", "read_jsonl", "server_dirs", "site_packages"]

EXTERNAL_SERVER_SCRIPT = """\"\"\"Stand-in process for a resources server that runs elsewhere (tests/interop/ngstack.py).\"\"\"
import signal

signals = {signal.SIGINT, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_BLOCK, signals)
signal.sigwait(signals)
"""


WATCHDOG_SCRIPT = """
import os, select, signal, subprocess, sys

# ng_run as a terminal starts it: a test run started in the background has SIGINT ignored, which ng_run would inherit.
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
while child.poll() is None:
    ready, _, _ = select.select([sys.stdin], [], [], 0.5)
    if ready and not os.read(sys.stdin.fileno(), 1024):  # EOF: the test is done, or died
        child.send_signal(signal.SIGINT)  # NeMo Gym's Ctrl-C: it stops its servers
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(0, signal.SIGKILL)  # and whatever it left in this process group
sys.exit(child.returncode)
"""
"""Runs ``ng_run`` in its own process group and stops all of it when its stdin closes, which
happens when the test stops it and also when the test process dies (even by SIGKILL)."""

RAY_HEAD_SCRIPT = """
import os, shutil, sys

import ray

ray.init(include_dashboard=False, num_cpus=1)
print("RAY_ADDRESS=" + ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes its end (or dies)
ray.shutdown()
shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)
"""
"""A local Ray cluster for one ``ng_run``, run with the interop venv's python."""

SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models")


def server_dirs(config: dict[str, Any]) -> list[tuple[str, str]]:
    """``(server_type, impl)`` of every server instance of a NeMo Gym config (other keys are globals)."""
    found = []
    for block in config.values():
        if isinstance(block, dict) and len(block) == 1 and next(iter(block)) in SERVER_TYPES:
            [(server_type, impls)] = block.items()
            found.extend((server_type, impl) for impl in impls)
    return found


def free_port() -> int:
    """A port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ng_env(ray_tmpdir: str | None = None, ray_token: str | None = None) -> dict[str, str]:
    """Environment for NeMo Gym processes: ours minus what would leak our interpreter into theirs.

    With ``ray_tmpdir`` and ``ray_token``: Ray's files go to that folder and its clients
    authenticate with that token (not ``~/.ray/auth_token``, shared by every cluster here).
    """
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"})
    if ray_tmpdir is not None:
        env["RAY_TMPDIR"] = ray_tmpdir
    if ray_token is not None:
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_token})
    return env


def site_packages(python: Path) -> Path:
    """Where the interop venv installed NeMo Gym's wheel (its servers, agents and data live there)."""
    out = subprocess.run(
        [str(python), "-c", "import nemo_gym; print(nemo_gym.PARENT_DIR)"],
        check=True, capture_output=True, text=True, env=ng_env(), timeout=120,
    )
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class NgRun:
    """One ``ng_run`` in its own working directory, stopped with SIGINT like a user's Ctrl-C.

    Args:
        python: The interop venv's python (its ``bin/`` holds ``ng_run``).
        workdir: A fresh directory; NeMo Gym writes its cache and results there.
        config: The merged config to run (instance name -> server block), written to
            ``workdir/interop_config.yaml``.
        local_servers: ``(server_type, impl) -> files`` for server dirs created in ``workdir``
            (file name -> text); NeMo Gym's own servers need no entry.
    """

    python: Path
    workdir: Path
    config: dict[str, Any]
    local_servers: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    head_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    urls: dict[str, str] = field(default_factory=dict)
    ray_tmpdir: str | None = None
    ray_token: str = field(default_factory=lambda: secrets.token_hex(32))
    ray_head: subprocess.Popen | None = None

    @property
    def venv(self) -> Path:
        return self.python.parent.parent

    @property
    def log_path(self) -> Path:
        return self.workdir / "ng_run.log"

    @property
    def head_server_arg(self) -> str:
        return f"+head_server={{host:127.0.0.1,port:{self.head_port}}}"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _prepare(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for (server_type, impl), files in self.local_servers.items():
            folder = self.workdir / server_type / impl
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (folder / name).write_text(text)
        for server_type, impl in server_dirs(self.config):
            venv_link = self.workdir / server_type / impl / ".venv"
            venv_link.parent.mkdir(parents=True, exist_ok=True)
            if not venv_link.exists():
                venv_link.symlink_to(self.venv, target_is_directory=True)
        path = self.workdir / "interop_config.yaml"
        path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return path

    def start(self, timeout_s: float = 480.0) -> NgRun:
        """Start ``ng_run`` and wait until it reports every server ready; fills :attr:`urls`."""
        config_path = self._prepare()
        args = [
            str(self.venv / "bin" / "ng_run"),
            f"+config_paths=[{config_path}]",
            "+skip_venv_if_present=true",
            f"+ray_head_node_address={self._start_ray()}",
            self.head_server_arg,
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [str(self.python), "-c", WATCHDOG_SCRIPT, *args], cwd=self.workdir,
                env=ng_env(self.ray_tmpdir, self.ray_token), stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while "servers ready!" not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"ng_run exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ng_run not ready within {timeout_s:g} s:\n{self.log_tail()}")
            time.sleep(0.5)
        instances = httpx.get(f"http://127.0.0.1:{self.head_port}/server_instances", timeout=10).json()
        self.urls = {inst["config_path"]: inst["url"] for inst in instances}
        return self

    def _start_ray(self, timeout_s: float = 120.0) -> str:
        """Start :data:`RAY_HEAD_SCRIPT`; returns the cluster's address."""
        # Short: Ray's unix socket paths under it must stay below ~107 characters.
        self.ray_tmpdir = tempfile.mkdtemp(prefix="ngray-", dir="/tmp")
        with open(self.workdir / "ray_head.log", "wb") as log:
            self.ray_head = subprocess.Popen(
                [str(self.python), "-c", RAY_HEAD_SCRIPT], cwd=self.workdir, env=ng_env(self.ray_tmpdir, self.ray_token),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True, text=True,
            )
        deadline = time.monotonic() + timeout_s
        line = ""
        while not line.startswith("RAY_ADDRESS="):
            ready, _, _ = select.select([self.ray_head.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = self.ray_head.stdout.readline() if ready else ""
            if not line:  # exited, or no address in time
                log_text = (self.workdir / "ray_head.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the Ray cluster for ng_run did not start:\n{log_text}")
        return line.strip().split("=", 1)[1]

    def run_cli(self, command: str, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
        """Run a NeMo Gym CLI (``ng_collect_rollouts`` ...) against this run's head server."""
        return subprocess.run(  # noqa: PLW1510  (the caller reads returncode and the output)
            [str(self.venv / "bin" / command), *args, self.head_server_arg],
            cwd=self.workdir, env=ng_env(self.ray_tmpdir, self.ray_token), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=timeout_s,
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ctrl-C (NeMo Gym stops its servers), SIGKILL what is left, stop the Ray cluster."""
        try:
            if self.process is not None:
                self._stop(timeout_s)
        finally:
            if self.ray_head is not None:
                self.ray_head.stdin.close()  # the cluster shuts down
                try:
                    self.ray_head.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(self.ray_head.pid, signal.SIGKILL)  # whatever of Ray is left
                except (ProcessLookupError, PermissionError):
                    pass
                self.ray_head.wait()
                self.ray_head = None
            if self.ray_tmpdir is not None:
                shutil.rmtree(self.ray_tmpdir, ignore_errors=True)
                self.ray_tmpdir = None

    def _stop(self, timeout_s: float) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.close()  # the watchdog Ctrl-Cs ng_run, then kills what is left
        try:
            self.process.wait(timeout_s + 5)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: only what it started
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        self.process = None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
