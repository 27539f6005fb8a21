"""When and how long an HTTP policy waits before sending a model request again, and until when.

Retried: 408, 409, 429 and 5xx replies (or whatever the server's ``x-should-retry`` says), and
requests whose connection failed. The wait is the server's ``retry-after-ms`` or ``Retry-After``
when it asks for 0-60 s, else exponential backoff with jitter, as the ``openai`` SDK waits.
A turn may have a :class:`Deadline`: each attempt gets at most the time left, and a wait that
would pass it is not begun.
"""

from __future__ import annotations

import email.utils
import random
import time

from nemo_gym_env.client.transport import Reply

__all__ = ["Deadline", "retry_delay", "should_retry"]

_RETRY_STATUSES = frozenset({408, 409, 429})


def retry_delay(attempt: int, headers: list[tuple[str, str]] | None = None) -> float:
    """Seconds to wait before retry number ``attempt + 1``: the server's ``Retry-After`` when sane, else backoff.

    ``retry-after-ms`` (milliseconds), then ``Retry-After`` (seconds or an HTTP date) are used
    when they ask for 0-60 s; otherwise 0.5 s doubling per attempt, at most 8 s, minus up to 25%
    jitter (the ``openai`` SDK's rule).

    Example:
        >>> retry_delay(0, [("retry-after", "2")])
        2.0
        >>> 0.375 <= retry_delay(0) <= 0.5
        True
    """
    for name, value in headers or ():
        wait: float | None = None
        try:
            if name == "retry-after-ms":
                wait = float(value) / 1000
            elif name == "retry-after":
                try:
                    wait = float(value)
                except ValueError:
                    when = email.utils.parsedate_to_datetime(value)
                    wait = when.timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            wait = None
        if wait is not None and 0 <= wait <= 60:
            return wait
    return min(0.5 * 2.0 ** attempt, 8.0) * (1 - 0.25 * random.random())


def should_retry(reply: Reply) -> bool:
    """Whether a non-2xx reply may be retried: the server's ``x-should-retry``, else 408/409/429/5xx."""
    for name, value in reply.headers:
        if name == "x-should-retry":
            if value == "true":
                return True
            if value == "false":
                return False
    return reply.status_code in _RETRY_STATUSES or reply.status_code >= 500


class Deadline:
    """The end of one turn's attempts, retries and waits; ``seconds=None``: no end but the attempts' own.

    Example:
        >>> turn = Deadline(30.0)
        >>> turn.attempt_timeout(20.0), turn.allows_wait(29.0), turn.allows_wait(31.0)
        (20.0, True, False)
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self._at = None if seconds is None else time.monotonic() + seconds

    def attempt_timeout(self, timeout_s: float) -> float:
        """An attempt's timeout: ``timeout_s``, or the time left when that is shorter."""
        if self._at is None:
            return timeout_s
        return max(min(timeout_s, self._at - time.monotonic()), 0.001)

    def allows_wait(self, delay: float) -> bool:
        """Whether waiting ``delay`` seconds before another attempt leaves time for it."""
        return self._at is None or time.monotonic() + delay < self._at
