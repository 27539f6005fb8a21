"""Process groups and signals: stopping a server with everything it started, SIGTERM as an exception.

Standard library only: the launcher, a server process and the command line all use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

from nemo_gym_env.errors import Stopped

__all__ = ["killpg", "sigterm_raises"]


def killpg(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pid`` leads; a group that is gone already is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`~nemo_gym_env.errors.Stopped` in the main thread, and Ctrl-C
    (SIGINT) raises ``KeyboardInterrupt`` also where the process started with SIGINT ignored (a background job
    of a script): a command that says "Ctrl-C to stop" stops on it, as uvicorn does."""

    def handler(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_sigint)
