"""SIGTERM as an exception, so that ``finally`` blocks stop every server a command started."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

__all__ = ["Stopped", "sigterm_raises"]


class Stopped(BaseException):
    """SIGTERM arrived (a ``BaseException``, as ``KeyboardInterrupt`` is: nothing swallows it)."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Stopped` in the main thread."""

    def handler(signum: int, frame: Any) -> None:
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
