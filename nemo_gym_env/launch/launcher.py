"""Start resources servers as separate uvicorn processes on loopback.

Parent side::

    from nemo_gym_env.launch import Launcher, bundled_spec

    with Launcher() as launcher:
        proc = launcher.start(bundled_spec("example_multi_step"))
        print(proc.url)                     # http://127.0.0.1:<free port>

Each server runs as ``python <entrypoint>`` in its own folder (as NeMo Gym runs ``python
app.py``); the app's ``__main__`` calls ``run_webserver()``, which lands in
:func:`nemo_gym_env.server.serving.serve`, the child side.

How it works, and why:

- **Ports without a race.** The parent binds and listens on the socket itself (port 0 picks
  a free one) and hands the file descriptor to the child, which serves on that very socket.
  Nothing can take the port between "found free" and "bound".
- **No orphans.** Every server is its own process group; stopping it is SIGTERM to the group,
  then SIGKILL after ``timeout_s``. Each child also holds the read end of a pipe whose write
  end only the parent owns: when the parent dies, even by SIGKILL, the child reads EOF and
  shuts itself (and its workers) down. Live launchers are closed at interpreter exit and when
  garbage-collected.
- **Restarts.** With ``auto_restart=True`` the parent keeps its copy of the listening socket,
  so a restarted server serves the same port and requests that arrive while it is down wait
  in the listen backlog. A server that crashes more than 5 times in 60 s is given up.
  Without it, the parent closes its copy once the server is ready, so a dead server refuses
  connections at once instead of leaving clients hanging.
- **Secrets.** Every launch gets a fresh session-signing secret through the environment
  variable :data:`~nemo_gym_env.system.child_env.SESSION_SECRET_ENV`; it is never logged.

``num_workers > 1`` runs uvicorn's multi-process supervisor on the same socket; each worker
rebuilds the app from the entrypoint file. Session state lives in each worker's memory, so a
server that keeps per-session state needs ``num_workers: 1`` (or sticky routing in front).

:mod:`nemo_gym_env.launch.shared` shares one process per server instance among every user in
the process (the embedded default of ``gym.make``).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# Nothing heavy here: ``gym.make`` spawns the embedded server through this module before it
# imports the env's own modules.
from nemo_gym_env.errors import LaunchError, ServerCrashed
from nemo_gym_env.launch.entrypoint import child_pythonpath, resolve_entrypoint
from nemo_gym_env.launch.logs import LogStreamer, temporary_log_dir
from nemo_gym_env.system.child_env import SERVER_ENV, SESSION_SECRET_ENV
from nemo_gym_env.system.closing import Closing
from nemo_gym_env.system.net import DEFAULT_HOST, answers_ok, http_url, is_loopback, listen_socket
from nemo_gym_env.system.processes import killpg
from nemo_gym_env.system.redaction import redact_text

if TYPE_CHECKING:
    from nemo_gym_env.launch.config import ServerSpec

__all__ = ["Launcher", "ServerProcess", "StartedServer"]

logger = logging.getLogger("nemo_gym_env.launch")

MAX_CRASHES = 5
CRASH_WINDOW_S = 60.0
MONITOR_INTERVAL_S = 0.5


@dataclass(eq=False)
class StartedServer:
    """What every launcher hands back for a server it started (:class:`ServerProcess` here,
    :class:`~nemo_gym_env.ray_cluster.RayServer` on a Ray node)."""

    name: str
    spec: ServerSpec
    host: str
    port: int
    url: str
    pid: int


@dataclass(eq=False)
class ServerProcess(StartedServer):
    """One launched server.

    Attributes:
        name: The instance name (``spec.instance_name``).
        spec: The spec it was started from.
        host: The address it listens on.
        port: The port it listens on.
        url: ``http://host:port``.
        pid: Process id of the current process (changes on restart).
        log_path: File receiving its stdout and stderr (appended across restarts).
        entrypoint: The absolute path of the script it runs.
        restarts: How many times it was restarted.
    """

    log_path: Path
    entrypoint: Path
    restarts: int = 0
    _state: str = field(default="starting", repr=False)
    _popen: subprocess.Popen | None = field(default=None, repr=False)
    _sock: socket.socket | None = field(default=None, repr=False)
    _crashes: collections.deque = field(default_factory=collections.deque, repr=False)
    _started: float = field(default=0.0, repr=False)

    def alive(self) -> bool:
        """Whether the process is running."""
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit code of the current process, ``None`` while it runs."""
        return None if self._popen is None else self._popen.poll()

    @property
    def status(self) -> str:
        """``starting``, ``running``, ``exited`` (died, not restarted), ``failed`` (given up) or ``stopped``."""
        if self._state == "running" and not self.alive():
            return "exited"
        return self._state

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, with credentials masked."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 256 * 1024))
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return redact_text("\n".join(text.splitlines()[-lines:]))


# ---- processes ----------------------------------------------------------------------------------


def _spawn(proc: ServerProcess, parent_fd: int, extra_env: Mapping[str, str], *, fresh_log: bool) -> None:
    """Start (or restart) the process of ``proc`` on its listening socket."""
    assert proc._sock is not None
    listen_fd = proc._sock.fileno()
    config = {**proc.spec.config, "host": proc.host, "port": proc.port}
    info = {
        "name": proc.name,
        "config": config,
        "listen_fd": listen_fd,
        "parent_fd": parent_fd,
        "entrypoint": str(proc.entrypoint),
    }
    env = {**os.environ, **extra_env}
    env.update(
        {
            SERVER_ENV: json.dumps(info, default=str),
            SESSION_SECRET_ENV: secrets.token_urlsafe(32),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": child_pythonpath(env.get("PYTHONPATH")),
        }
    )
    with open(proc.log_path, "wb" if fresh_log else "ab") as log:
        proc._popen = subprocess.Popen(
            [sys.executable, str(proc.entrypoint)],
            cwd=proc.entrypoint.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(listen_fd, parent_fd),
            start_new_session=True,
        )
    proc.pid = proc._popen.pid
    proc._started = time.monotonic()


def _append_log(proc: ServerProcess, line: str) -> None:
    try:
        with open(proc.log_path, "a", encoding="utf-8") as f:
            f.write(f"[nemo_gym_env.launch] {line}\n")
    except OSError:
        pass


def _terminate(procs: Iterable[ServerProcess], timeout_s: float) -> None:
    """SIGTERM every process group, wait up to ``timeout_s``, SIGKILL what is left, reap."""
    popens = [p._popen for p in procs if p._popen is not None]
    for popen in popens:
        killpg(popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for popen in popens:
        try:
            popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # Kill whatever is left of the group (hung leader, workers orphaned by a dead leader).
        killpg(popen.pid, signal.SIGKILL)
        popen.wait()


def _close_socket(proc: ServerProcess) -> None:
    if proc._sock is not None:
        proc._sock.close()
        proc._sock = None


# ---- the launcher -----------------------------------------------------------------------------


class Launcher(Closing):
    """Starts servers as child processes and stops them again; a context manager.

    Args:
        log_dir: Folder for ``<name>.log`` files; default: a temporary folder removed on close.
        stream_logs: Also echo every server's output to this process's stderr as ``[name] line``.
        ready_timeout_s: How long a server may take to answer ``GET /`` with 200.
        auto_restart: Restart servers that exit unexpectedly, on the same port.
        extra_env: Environment variables added to every server's environment.
    """

    def __init__(
        self,
        *,
        log_dir: Path | None = None,
        stream_logs: bool = False,
        ready_timeout_s: float = 60.0,
        auto_restart: bool = False,
        extra_env: Mapping[str, str] | None = None,
    ):
        self.ready_timeout_s = ready_timeout_s
        self.auto_restart = auto_restart
        self.extra_env = dict(extra_env or {})
        self._lock = threading.RLock()
        self._servers: dict[str, ServerProcess] = {}
        self._closed = threading.Event()
        owned = log_dir is None
        self.log_dir = temporary_log_dir() if owned else Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # The children watch the read end; only this process holds the (non-inheritable) write end.
        self._parent_fd, write_fd = os.pipe()
        self._streamer = LogStreamer() if stream_logs else None
        self._finalizer = weakref.finalize(
            self,
            _shutdown,
            self._servers,
            self._lock,
            self._closed,
            (self._parent_fd, write_fd),
            self.log_dir if owned else None,
            self._streamer,
        )
        self._monitor: threading.Thread | None = None
        if auto_restart:
            self._monitor = threading.Thread(
                target=_monitor_loop,
                args=(weakref.ref(self), self._closed),
                name="nemo-gym-env-monitor",
                daemon=True,
            )
            self._monitor.start()

    # ---- public API ---------------------------------------------------------------------

    @property
    def servers(self) -> dict[str, ServerProcess]:
        """The servers started and not stopped, by instance name (a copy)."""
        with self._lock:
            return dict(self._servers)

    def start(
        self,
        spec: ServerSpec,
        *,
        host: str | None = None,
        port: int | None = None,
        while_starting: Callable[[], object] | None = None,
    ) -> ServerProcess:
        """Start one server and wait until it answers ``GET /``.

        Args:
            spec: The server to start (``spec.config["entrypoint"]`` names its script).
            host: Address to bind; default ``spec.config["host"]`` or 127.0.0.1.
            port: Port to bind; default ``spec.config["port"]`` or a free one.
            while_starting: Called once the process is spawned, before waiting for it: work
                that overlaps the server's start-up (``gym.make`` imports the env's modules
                there). If it raises, the server is stopped and the error propagates. Its time
                counts towards ``ready_timeout_s``.

        Returns:
            The running server.

        Raises:
            ServerCrashed: If it exits while starting.
            LaunchError: If it is not ready within ``ready_timeout_s``, or cannot be started.
        """
        proc = self._spawn_new(spec, host, port)
        try:
            if while_starting is not None:
                while_starting()
            self._wait_ready(proc)
        except BaseException:
            self._discard(proc)
            raise
        return proc

    def start_all(self, specs: Iterable[ServerSpec]) -> list[ServerProcess]:
        """Start several servers in parallel: spawn all, then wait for all.

        If any fails, the ones started by this call are stopped and the first error is raised.
        """
        procs: list[ServerProcess] = []
        try:
            for spec in specs:
                procs.append(self._spawn_new(spec, None, None))
            for proc in procs:
                self._wait_ready(proc)
        except BaseException:
            for proc in procs:
                self._discard(proc)
            raise
        return procs

    def restart(self, name: str) -> ServerProcess:
        """Stop a server (if running) and start it again on the same host and port.

        Raises:
            LaunchError: If there is no such server or it does not come back.
        """
        with self._lock:
            proc = self._get(name)
            proc._state = "starting"
        _terminate([proc], 5.0)
        try:
            if proc._sock is None:
                proc._sock = listen_socket(proc.host, proc.port)
            proc.restarts += 1
            proc._crashes.clear()
            _append_log(proc, f"restart #{proc.restarts} requested")
            _spawn(proc, self._parent_fd, self.extra_env, fresh_log=False)
            self._wait_ready(proc)
        except BaseException:
            self._discard(proc)
            raise
        return proc

    def stop(self, name: str | None = None, timeout_s: float = 5.0) -> None:
        """Stop one server (``name``) or all (``None``): SIGTERM, then SIGKILL after ``timeout_s``.

        Raises:
            KeyError: If ``name`` is not a running server of this launcher.
        """
        with self._lock:
            if name is None:
                procs = list(self._servers.values())
                self._servers.clear()
            else:
                procs = [self._get(name, error=KeyError)]
                del self._servers[name]
            for proc in procs:
                proc._state = "stopping"
        _terminate(procs, timeout_s)
        for proc in procs:
            proc._state = "stopped"
            _close_socket(proc)
            logger.info("stopped server %r (%s)", proc.name, proc.url)

    def close(self) -> None:
        """Stop every server and release everything; safe to call more than once."""
        self._finalizer()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=2.0)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return not self._finalizer.alive

    def __repr__(self) -> str:
        return f"Launcher(servers={sorted(self._servers)}, log_dir={str(self.log_dir)!r})"

    # ---- internals ----------------------------------------------------------------------

    def _get(self, name: str, error: type[Exception] = LaunchError) -> ServerProcess:
        proc = self._servers.get(name)
        if proc is None:
            raise error(
                f"no server named {name!r} in this launcher; running: {sorted(self._servers) or 'none'}"
            )
        return proc

    def _spawn_new(self, spec: ServerSpec, host: str | None, port: int | None) -> ServerProcess:
        if self.closed:
            raise LaunchError("this Launcher is closed; create a new one")
        entrypoint = resolve_entrypoint(spec)
        host = host or str(spec.config.get("host") or DEFAULT_HOST)
        port = int(port if port is not None else spec.config.get("port") or 0)
        with self._lock:
            old = self._servers.get(spec.instance_name)
            if old is not None and old.alive():
                raise LaunchError(
                    f"server {spec.instance_name!r} is already running at {old.url}; stop it first"
                )
            if old is not None:
                self.stop(spec.instance_name)
            sock = listen_socket(host, port)
            port = sock.getsockname()[1]
            log_path = self.log_dir / f"{spec.instance_name}.log"
            proc = ServerProcess(
                spec.instance_name, spec, host, port, http_url(host, port), 0, log_path, entrypoint, _sock=sock
            )
            try:
                _spawn(proc, self._parent_fd, self.extra_env, fresh_log=True)
            except OSError as exc:
                sock.close()
                raise LaunchError(
                    f"cannot start server {spec.instance_name!r} ({entrypoint}): {exc}"
                ) from None
            self._servers[proc.name] = proc
        if self._streamer is not None:
            self._streamer.add(proc.name, log_path)
        if not is_loopback(host):
            logger.warning(
                "server %r listens on %s: reachable from the network, routes unauthenticated",
                proc.name,
                proc.url,
            )
        logger.info("started server %r (pid %d) at %s; log: %s", proc.name, proc.pid, proc.url, log_path)
        return proc

    def _wait_ready(self, proc: ServerProcess) -> None:
        assert proc._popen is not None
        deadline = proc._started + self.ready_timeout_s
        asked = False
        while True:
            returncode = proc._popen.poll()
            if returncode is not None:
                _terminate([proc], 1.0)  # workers a dead supervisor left behind
                raise ServerCrashed(proc.name, returncode, proc.log_tail())
            remaining = deadline - time.monotonic()
            if remaining <= 0 and asked:
                raise LaunchError(
                    f"server {proc.name!r} at {proc.url} did not answer GET / with 200 within "
                    f"{self.ready_timeout_s:g} s; last log lines:\n{proc.log_tail()}\n"
                    f"Check its log ({proc.log_path}); if it is just slow to start, raise ready_timeout_s."
                )
            asked = True
            # The socket listens from the start: a request sent while the server boots waits in
            # the backlog and is answered as soon as the server accepts.
            if answers_ok(proc.host, proc.port, min(1.0, max(remaining, 0.05))):
                break
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        with self._lock:
            if proc._state == "starting":
                proc._state = "running"
            if not self.auto_restart:
                _close_socket(proc)  # a dead server now refuses connections instead of hanging clients
        logger.info("server %r ready at %s", proc.name, proc.url)

    def _discard(self, proc: ServerProcess) -> None:
        with self._lock:
            if self._servers.get(proc.name) is proc:
                del self._servers[proc.name]
        _terminate([proc], 2.0)
        _close_socket(proc)
        proc._state = "stopped"

    def _check_servers(self) -> None:
        """Restart servers that exited unexpectedly (monitor thread, ``auto_restart`` only)."""
        with self._lock:
            for proc in list(self._servers.values()):
                if proc._state != "running" or proc._popen is None or proc._popen.poll() is None:
                    continue
                code = proc._popen.returncode
                killpg(proc._popen.pid, signal.SIGKILL)  # stray workers of a dead supervisor
                now = time.monotonic()
                proc._crashes.append(now)
                while proc._crashes and proc._crashes[0] < now - CRASH_WINDOW_S:
                    proc._crashes.popleft()
                if len(proc._crashes) > MAX_CRASHES:
                    proc._state = "failed"
                    _close_socket(proc)
                    _append_log(
                        proc,
                        f"exited with code {code}; crashed {len(proc._crashes)} times in {CRASH_WINDOW_S:g} s, giving up",
                    )
                    logger.error(
                        "server %r crashed %d times in %g s (last exit code %s); giving up. Last log lines:\n%s",
                        proc.name,
                        len(proc._crashes),
                        CRASH_WINDOW_S,
                        code,
                        proc.log_tail(20),
                    )
                    continue
                proc.restarts += 1
                _append_log(proc, f"exited with code {code}; restart #{proc.restarts}")
                logger.warning(
                    "server %r exited with code %s; restarting (restart #%d)", proc.name, code, proc.restarts
                )
                try:
                    _spawn(proc, self._parent_fd, self.extra_env, fresh_log=False)
                except OSError as exc:
                    proc._state = "failed"
                    _close_socket(proc)
                    logger.error("server %r could not be restarted: %s", proc.name, exc)


def _monitor_loop(ref: weakref.ref, closed: threading.Event) -> None:
    while not closed.wait(MONITOR_INTERVAL_S):
        launcher = ref()
        if launcher is None:
            return
        try:
            launcher._check_servers()
        except Exception:  # the monitor must survive anything
            logger.exception("launcher monitor failed")
        del launcher


def _shutdown(
    servers: dict[str, ServerProcess],
    lock: threading.RLock,
    closed: threading.Event,
    fds: tuple[int, int],
    owned_log_dir: Path | None,
    streamer: LogStreamer | None,
) -> None:
    """Stop everything a Launcher owns (close, garbage collection, interpreter exit)."""
    closed.set()
    with lock:
        procs = list(servers.values())
        servers.clear()
        for proc in procs:
            proc._state = "stopping"
    _terminate(procs, 5.0)
    for proc in procs:
        proc._state = "stopped"
        _close_socket(proc)
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if streamer is not None:
        streamer.close()
    if owned_log_dir is not None:
        shutil.rmtree(owned_log_dir, ignore_errors=True)


