"""Helpers for tests of servers and parsers (the project's own and users' servers alike)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["times_slower_than_plain"]


def times_slower_than_plain(read: Callable[[str], object], text: str, repeats: int = 3) -> float:
    """How many times longer ``read(text)`` takes than ``read`` of plain text of the same length.

    Both are timed side by side, best of ``repeats`` each, so the figure is a ratio that holds
    on a busy machine. A reader that is linear on ``text`` gives about 1 (a few at most); one
    that backtracks quadratically on 100k characters gives thousands. Times under a
    millisecond count as a millisecond.

    Example:
        >>> times_slower_than_plain(len, "{" * 100_000) < 50
        True
    """
    plain = "x" * len(text)

    def best(arg: str) -> float:
        fastest = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            read(arg)
            fastest = min(fastest, time.perf_counter() - started)
        return max(fastest, 1e-3)

    return best(text) / best(plain)
