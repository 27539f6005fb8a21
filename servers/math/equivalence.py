"""Symbolic answer equivalence with math-verify, run inside a worker process.

``math_verify.parse`` turns each answer into SymPy objects and ``math_verify.verify``
compares them, so ``\\frac{1}{2}``, ``0.5`` and ``1/2`` agree, as do ``2\\sqrt{2}`` and
``\\sqrt{8}``, ``\\{1, 2\\}`` and ``\\{2, 1\\}``, ``[1, 2)`` and ``[1,2)``::

    >>> equivalent("\\\\frac{1}{2}", "0.5", timeout_s=10.0)
    'equal'
    >>> equivalent("720", "721", timeout_s=10.0)
    'unequal'

SymPy can take unbounded time (``9^{9^{9}}`` never finishes). :func:`equivalent` stops
itself with a ``SIGALRM`` timer after ``timeout_s`` when it runs on a worker's main thread;
the caller's hard limit (killing the worker) covers the rest.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Literal

__all__ = ["Equivalence", "equivalent", "init_worker", "strip_math_delimiters"]

Equivalence = Literal["equal", "unequal", "timeout"]


class _Deadline(BaseException):
    """Raised by the timer; a BaseException so library code that catches Exception lets it through."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Deadline


def strip_math_delimiters(text: str) -> str:
    """``$x$``, ``$$x$$``, ``\\(x\\)``, ``\\[x\\]`` -> ``x`` (math-verify reads the box content as LaTeX)."""
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            return text[len(left) : len(text) - len(right)].strip()
    return text


def _parse(answer: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    boxed = "\\boxed{" + strip_math_delimiters(answer) + "}"
    # parsing_timeout=None: math-verify's own SIGALRM timer would replace ours.
    return parse(
        boxed, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=None
    )


def _compare(expected: str, answer: str) -> bool:
    from math_verify import verify

    # With its own timers off, math-verify warns on every new process; the timeout is ours.
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    gold, given = _parse(expected), _parse(answer)
    # timeout_seconds=None for the same reason as parsing_timeout=None above.
    return bool(gold and given and verify(gold, given, timeout_seconds=None))


def equivalent(expected: str, answer: str, timeout_s: float) -> Equivalence:
    """Whether ``answer`` is mathematically equal to ``expected`` (both LaTeX or plain text).

    Returns ``"timeout"`` if the comparison ran past ``timeout_s`` seconds (on a main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return "equal" if _compare(expected, answer) else "unequal"
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
            result = _compare(expected, answer)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Deadline:
        return "timeout"
    finally:
        signal.signal(signal.SIGALRM, previous)
    return "equal" if result else "unequal"


def init_worker() -> None:
    """Worker initializer: import math-verify and SymPy and warm their caches."""
    equivalent("\\frac{1}{2}", "0.5", timeout_s=60.0)
