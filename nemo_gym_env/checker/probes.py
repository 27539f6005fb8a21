"""Bounded requests to the server under check: every probe has a timeout and never raises.

A probe's result is an :class:`Answer`: the status (None when there was none), the body, how long it
took and, when it failed, why, in words a report can quote as evidence.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

from nemo_gym_env.client.resources import CookieJar, ResourcesClient
from nemo_gym_env.errors import ConnectFailed, ServerError, TransportError

__all__ = ["Answer", "Prober", "percentiles"]

_SHOW = 160  # characters of a reply quoted as evidence


@dataclass
class Answer:
    """One request's outcome."""

    method: str
    route: str
    status: int | None
    body: Any
    text: str
    seconds: float
    error: str | None = None
    set_cookie: bool = False

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def client_error(self) -> bool:
        """A 4xx answer."""
        return self.status is not None and 400 <= self.status < 500

    def evidence(self) -> str:
        """``POST /verify -> 200 {"reward": 0.0, ...} (12 ms)``, or what went wrong."""
        where = f"{self.method} {self.route}"
        if self.status is None:
            return f"{where} -> {self.error}"
        text = " ".join(self.text.split())
        if isinstance(self.body, dict) and "reward" in self.body:  # a verify or step reply: what matters in it
            shown = {k: self.body[k] for k in ("reward", "terminated", "truncated", "failure_reason", "observation")
                     if k in self.body}
            text = " ".join(json.dumps(shown).split())
        text = text if len(text) <= _SHOW else text[:_SHOW] + "..."
        return f"{where} -> {self.status} {text} ({self.seconds * 1000:.0f} ms)"

    def reward(self) -> float | None:
        """The reply's ``reward`` when it is a finite number."""
        value = self.body.get("reward") if isinstance(self.body, dict) else None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None


class Prober:
    """Requests to one server, each bounded by ``timeout_s``; connection failures are answers too."""

    def __init__(self, url: str, timeout_s: float):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.client = ResourcesClient(self.url, timeout_s=timeout_s, verify_timeout_s=timeout_s, connect_retries=0)

    async def get(self, route: str, *, timeout_s: float | None = None) -> Answer:
        """``GET route`` (within ``timeout_s``, default the prober's)."""
        started = time.monotonic()
        limit = timeout_s or self.timeout_s
        try:
            reply = await self.client.http.request("GET", route, timeout_s=limit)
        except ConnectFailed as exc:
            return Answer("GET", route, None, None, "", time.monotonic() - started, f"no connection ({exc})")
        except TimeoutError:
            return Answer("GET", route, None, None, "", limit, f"no answer within {limit:g} s")
        except TransportError as exc:
            return Answer("GET", route, None, None, "", time.monotonic() - started, f"connection broke ({exc})")
        return self._answer("GET", route, reply, started)

    async def post(self, route: str, body: Any = None, jar: CookieJar | None = None, *,
                   raw: bytes | None = None) -> Answer:
        """``POST route`` with ``body`` as JSON (or ``raw`` bytes as they are) and the jar's cookies."""
        jar = {} if jar is None else jar
        started = time.monotonic()
        before = dict(jar)
        try:
            if raw is not None:
                reply = await self.client.post_bytes(route, raw, jar)
            else:
                reply = await self.client.post_raw(route, body, jar)
        except ServerError as exc:
            why = str(exc).split(": ", 1)[-1] if ": " in str(exc) else str(exc)
            return Answer("POST", route, None, None, "", time.monotonic() - started, why)
        answer = self._answer("POST", route, reply, started)
        answer.set_cookie = jar != before
        return answer

    @staticmethod
    def _answer(method: str, route: str, reply: Any, started: float) -> Answer:
        try:
            body = json.loads(reply.content) if reply.content else None
        except (ValueError, RecursionError):
            body = None
        return Answer(method, route, reply.status_code, body, reply.text, time.monotonic() - started)


def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of ``seconds``, in milliseconds.

    Example:
        >>> percentiles([0.001 * i for i in range(1, 101)])
        {'p50': 50.0, 'p90': 90.0, 'p99': 99.0, 'max': 100.0}
    """
    if not seconds:
        return {}
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] * 1000, 1)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": round(ordered[-1] * 1000, 1)}
