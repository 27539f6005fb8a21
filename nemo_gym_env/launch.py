"""Start resources servers as separate uvicorn processes on loopback.

Parent side::

    from nemo_gym_env.catalog import bundled_spec
    from nemo_gym_env.launch import Launcher

    with Launcher() as launcher:
        proc = launcher.start(bundled_spec("example_multi_step"))
        print(proc.url)                     # http://127.0.0.1:<free port>

Each server runs as ``python <entrypoint>`` in its own folder (as NeMo Gym runs ``python
app.py``); the app's ``__main__`` calls ``run_webserver()``, which lands in :func:`serve`
(the child side lives in :mod:`nemo_gym_env.serving`).

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
  variable :data:`~nemo_gym_env.sessions.SESSION_SECRET_ENV`; it is never logged.

``num_workers > 1`` runs uvicorn's multi-process supervisor on the same socket; each worker
rebuilds the app from the entrypoint file. Session state lives in each worker's memory, so a
server that keeps per-session state needs ``num_workers: 1`` (or sticky routing in front).

:func:`acquire_server` / :func:`release_server` share one process per server instance among
every user in the process (the embedded default of ``gym.make``).
"""

from __future__ import annotations

import collections
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

# Nothing heavy at module level: ``gym.make`` spawns the embedded server through this module
# before it imports the env's own modules, and the server process imports it to serve.
from .sessions import SERVER_ENV, SESSION_SECRET_ENV

if TYPE_CHECKING:
    from .config import ServerSpec

__all__ = [
    "SERVER_ENV",
    "LaunchError",
    "Launcher",
    "ServerCrashed",
    "ServerProcess",
    "acquire_server",
    "http_url",
    "is_loopback",
    "listen_socket",
    "release_server",
    "resolve_entrypoint",
    "serve",
    "shared_servers",
]

logger = logging.getLogger("nemo_gym_env.launch")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
MAX_CRASHES = 5
CRASH_WINDOW_S = 60.0
MONITOR_INTERVAL_S = 0.5
PARENT_GONE_GRACE_S = 5.0


class LaunchError(RuntimeError):
    """A server could not be started, restarted or found."""


class ServerCrashed(LaunchError):
    """A server process exited while starting.

    Attributes:
        name: The instance name.
        returncode: The exit code (negative: killed by that signal).
        log_tail: The last lines of its log.
    """

    def __init__(self, name: str, returncode: int | None, log_tail: str):
        self.name = name
        self.returncode = returncode
        self.log_tail = log_tail
        super().__init__(
            f"server {name!r} exited with code {returncode} during start-up; last log lines:\n{log_tail}"
        )


@dataclass(eq=False)
class ServerProcess:
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

    name: str
    spec: ServerSpec
    host: str
    port: int
    url: str
    pid: int
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
        from .config import redact

        text = data.decode("utf-8", errors="replace")
        return redact("\n".join(text.splitlines()[-lines:]))


# ---- entrypoints and sockets ------------------------------------------------------------------


def resolve_entrypoint(spec: ServerSpec) -> Path:
    """The absolute path of a spec's ``entrypoint`` script.

    A relative entrypoint is looked up in the server folder (the YAML's folder, or its parent
    when the YAML lives in ``configs/``), then in NeMo Gym's layout
    ``<gym root>/resources_servers/<impl_name>/`` next to the YAML and in the current directory.

    Raises:
        LaunchError: If no candidate exists; the message lists every path tried.
    """
    entry = Path(str(spec.config.get("entrypoint") or "app.py")).expanduser()
    if entry.is_absolute():
        candidates = [entry]
    else:
        candidates = []
        if spec.config_dir is not None:
            cdir = Path(spec.config_dir)
            candidates.append((cdir.parent if cdir.name == "configs" else cdir) / entry)
            for root in (cdir, cdir.parent):
                candidates.append(root / "resources_servers" / spec.impl_name / entry)
        candidates.append(Path.cwd() / "resources_servers" / spec.impl_name / entry)
    for candidate in dict.fromkeys(candidates):
        if candidate.is_file():
            return candidate.resolve()
    tried = "\n  ".join(str(c) for c in dict.fromkeys(candidates))
    raise LaunchError(
        f"entrypoint {str(entry)!r} of server {spec.instance_name!r} not found; tried:\n  {tried}\n"
        "Set 'entrypoint' to a path relative to the server folder (the folder holding configs/)."
    )


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port) and listening; :class:`LaunchError` if it cannot be."""
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise LaunchError(f"cannot resolve host {host!r}: {exc}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise LaunchError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another port or leave it unset for a free one"
        ) from None
    return sock


def http_url(host: str, port: int) -> str:
    """``http://host:port``, with an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _answers_ok(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``GET /`` on ``host:port`` answers with status 200 (one connection, closed after).

    ``timeout_s`` bounds the connect and each read. A plain socket rather than an HTTP library:
    the launcher polls this while the server boots, and it must not import anything that takes
    CPU from that start-up.
    """
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s) as conn:
            netloc = http_url(host, port).partition("://")[2]
            conn.sendall(f"GET / HTTP/1.1\r\nHost: {netloc}\r\nConnection: close\r\n\r\n".encode("latin-1"))
            head = b""
            while b"\r\n" not in head and len(head) < 8192:
                chunk = conn.recv(8192)
                if not chunk:
                    break
                head += chunk
    except OSError:  # refused, reset, timed out
        return False
    status_line = head.partition(b"\r\n")[0].split()
    return len(status_line) >= 2 and status_line[0].startswith(b"HTTP/") and status_line[1] == b"200"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _child_pythonpath(existing: str | None) -> str:
    """``PYTHONPATH`` for a child: the folder holding this nemo_gym_env first, unless it is site-packages.

    So a child started from a checkout (tests, development) imports the same nemo_gym_env as
    this process, installed or not.
    """
    root = Path(__file__).resolve().parent.parent
    parts = [existing] if existing else []
    if root.name not in ("site-packages", "dist-packages"):
        parts.insert(0, str(root))
    return os.pathsep.join(parts)


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
            "PYTHONPATH": _child_pythonpath(env.get("PYTHONPATH")),
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


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _terminate(procs: Iterable[ServerProcess], timeout_s: float) -> None:
    """SIGTERM every process group, wait up to ``timeout_s``, SIGKILL what is left, reap."""
    popens = [p._popen for p in procs if p._popen is not None]
    for popen in popens:
        _killpg(popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for popen in popens:
        try:
            popen.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        # Kill whatever is left of the group (hung leader, workers orphaned by a dead leader).
        _killpg(popen.pid, signal.SIGKILL)
        popen.wait()


def _close_socket(proc: ServerProcess) -> None:
    if proc._sock is not None:
        proc._sock.close()
        proc._sock = None


# ---- the launcher -----------------------------------------------------------------------------


class Launcher:
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
        self.log_dir = Path(tempfile.mkdtemp(prefix="nemo_gym_env_logs_")) if owned else Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # The children watch the read end; only this process holds the (non-inheritable) write end.
        self._parent_fd, write_fd = os.pipe()
        self._streamer = _LogStreamer() if stream_logs else None
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            if _answers_ok(proc.host, proc.port, min(1.0, max(remaining, 0.05))):
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
                _killpg(proc._popen.pid, signal.SIGKILL)  # stray workers of a dead supervisor
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
    streamer: _LogStreamer | None,
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


class _LogStreamer:
    """Echo new lines of log files to stderr as ``[name] line`` (tails the files, never blocks a child)."""

    def __init__(self) -> None:
        self._files: dict[Path, list[Any]] = {}  # path -> [name, offset, partial bytes]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemo-gym-env-logs", daemon=True)
        self._thread.start()

    def add(self, name: str, path: Path) -> None:
        with self._lock:
            self._files[path] = [name, 0, b""]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._pump(final=False)
        self._pump(final=True)

    def _pump(self, final: bool) -> None:
        with self._lock:
            entries = list(self._files.items())
        for path, entry in entries:
            name, offset, partial = entry
            try:
                with open(path, "rb") as f:
                    if os.fstat(f.fileno()).st_size < offset:
                        offset = 0  # truncated: a fresh start under the same name
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            entry[1] = offset + len(data)
            *lines, rest = (partial + data).split(b"\n")
            if final and rest:
                lines, rest = [*lines, rest], b""
            entry[2] = rest
            if lines:
                text = "".join(f"[{name}] {line.decode('utf-8', errors='replace')}\n" for line in lines)
                try:
                    sys.stderr.write(text)
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass


# ---- the shared registry (gym.make's embedded servers) ---------------------------------------

_shared_lock = threading.RLock()
_shared_launcher: Launcher | None = None
_shared_counts: dict[str, int] = {}


def acquire_server(spec: ServerSpec, *, while_starting: Callable[[], object] | None = None) -> ServerProcess:
    """Get the process-wide server for ``spec.instance_name``, starting it on first use.

    Every caller in the process shares one process per instance name (a later spec with the
    same name gets the running server). Reference-counted: pair each call with
    :func:`release_server`. Servers are restarted automatically if they die.
    ``while_starting`` is passed to :meth:`Launcher.start` when this call starts the server
    (not called when it is already running).
    """
    global _shared_launcher
    with _shared_lock:
        if _shared_launcher is None or _shared_launcher.closed:
            _shared_launcher = Launcher(auto_restart=True)
        name = spec.instance_name
        proc = _shared_launcher.servers.get(name)
        if name in _shared_counts and proc is not None:
            if proc.status == "failed":
                proc = _shared_launcher.restart(name)
            _shared_counts[name] += 1
            return proc
        proc = _shared_launcher.start(spec, while_starting=while_starting)
        _shared_counts[name] = 1
        return proc


def release_server(name: str) -> None:
    """Drop one reference taken by :func:`acquire_server`; the last one stops the server.

    Raises:
        KeyError: If ``name`` holds no reference.
    """
    with _shared_lock:
        count = _shared_counts.get(name)
        if count is None:
            raise KeyError(f"release_server({name!r}) without a matching acquire_server")
        if count > 1:
            _shared_counts[name] = count - 1
            return
        del _shared_counts[name]
        if _shared_launcher is not None and name in _shared_launcher.servers:
            _shared_launcher.stop(name)


def shared_servers() -> dict[str, ServerProcess]:
    """The servers currently held through :func:`acquire_server`, by instance name (a copy)."""
    with _shared_lock:
        running = _shared_launcher.servers if _shared_launcher is not None else {}
        return {name: running[name] for name in _shared_counts if name in running}


# ---- child side -------------------------------------------------------------------------------


def serve(server_cls: type) -> None:
    """Serve ``server_cls`` in this process (called by ``SimpleResourcesServer.run_webserver()``).

    Under a :class:`Launcher`, reads what to serve from :data:`SERVER_ENV` and serves on the
    inherited socket. Run by hand (``python app.py host=0.0.0.0 port=9000 key=value ...``),
    binds ``host``/``port`` from the arguments (default 127.0.0.1:8000); other ``key=value``
    arguments become config keys. See :mod:`nemo_gym_env.serving`.
    """
    from .serving import serve_server

    serve_server(server_cls)
