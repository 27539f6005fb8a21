"""The process-wide servers behind ``gym.make``: one per server instance, shared and reference-counted.

Every env of a process that names the same bundled server (or config instance) talks to one
server process, started by the first :func:`acquire_server` and stopped by the last
:func:`release_server`. The servers run under one :class:`~nemo_gym_env.launch.launcher.Launcher`
with ``auto_restart=True``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from nemo_gym_env.launch.launcher import Launcher, ServerProcess

if TYPE_CHECKING:
    from nemo_gym_env.launch.config import ServerSpec

__all__ = ["acquire_server", "release_server", "shared_servers"]

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
