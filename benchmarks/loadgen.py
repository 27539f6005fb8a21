"""A plain load generator: scripted episodes as pre-built HTTP requests, no env in between.

It measures what the server itself can take (its saturation rate), the yardstick the
vector env is compared with. Each worker plays whole episodes one after another on its own
keep-alive connection: ``/seed_session`` (its ``Set-Cookie`` kept), every tool call, then
``/verify``, with exactly the bodies the env would send (:func:`harness.scripted_requests`).

Two clients:

- ``raw``: a minimal HTTP/1.1 client on asyncio streams; request bytes are built once per
  task, so the client costs next to nothing and the server is the bottleneck.
- ``httpx``: one pooled ``httpx.AsyncClient``, the same bodies and cookie headers.

Every run is bounded by ``duration_s`` and ``max_episodes`` and stops by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LoadResult", "run_load", "run_load_async"]


@dataclass
class LoadResult:
    """Outcome of one load run."""

    client: str
    concurrency: int
    episodes: int
    requests: int
    errors: int
    elapsed_s: float
    episodes_per_s: float
    first_error: str | None = None
    reward_sum: float = 0.0
    latencies_s: list[float] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        """Everything but the raw latencies."""
        out = asdict(self)
        out.pop("latencies_s")
        return out


class _Stop(Exception):
    pass


class _RawConnection:
    """One keep-alive HTTP/1.1 connection; requests strictly one after another."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes, bytes | None]:
        """Send one request; returns (status, body, the ``name=value`` of its Set-Cookie or None)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
        self.writer.write(head + body)
        reader = self.reader
        assert reader is not None
        header_block = await reader.readuntil(b"\r\n\r\n")
        lines = header_block.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, chunked, cookie, close = None, False, None, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"set-cookie":
                cookie = value.strip().split(b";", 1)[0]
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        if chunked:
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                data = await reader.readexactly(size + 2)
                if size == 0:
                    break
                parts.append(data[:-2])
            payload = b"".join(parts)
        else:
            payload = await reader.readexactly(length or 0)
        if close:
            self.close()
        return status, payload, cookie

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _head(host: str, route: str, length: int, cookie: bytes | None) -> bytes:
    lines = [
        f"POST {route} HTTP/1.1",
        f"host: {host}",
        "content-type: application/json",
        f"content-length: {length}",
    ]
    head = ("\r\n".join(lines) + "\r\n").encode()
    if cookie:
        head += b"cookie: " + cookie + b"\r\n"
    return head + b"\r\n"


def _reward(body: bytes) -> float:
    import json

    return float(json.loads(body)["reward"])


async def _raw_worker(url: str, episodes: Sequence[list[tuple[str, bytes]]], start: int, state: dict) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    conn = _RawConnection(host, port)
    netloc = parts.netloc
    k = start
    try:
        while not state["stop"]:
            requests = episodes[k % len(episodes)]
            k += 1
            cookie = None
            for route, body in requests:
                t0 = time.perf_counter()
                try:
                    status, payload, set_cookie = await conn.request(_head(netloc, route, len(body), cookie), body)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    conn.close()
                    _error(state, f"{route}: {type(exc).__name__}: {exc}")
                    break
                state["latencies"].append(time.perf_counter() - t0)
                state["requests"] += 1
                if set_cookie:
                    cookie = set_cookie
                if status >= 400:
                    _error(state, f"{route}: HTTP {status}: {payload[:200]!r}")
                    break
                if route == "/verify":
                    state["reward"] += _reward(payload)
                    _episode_done(state)
    except _Stop:
        pass
    finally:
        conn.close()


async def _httpx_worker(client: Any, url: str, episodes: Sequence[list[tuple[str, bytes]]], start: int,
                        state: dict) -> None:
    import httpx

    k = start
    try:
        while not state["stop"]:
            requests = episodes[k % len(episodes)]
            k += 1
            headers = {"content-type": "application/json"}
            for route, body in requests:
                t0 = time.perf_counter()
                try:
                    response = await client.post(url + route, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    _error(state, f"{route}: {type(exc).__name__}: {exc}")
                    break
                state["latencies"].append(time.perf_counter() - t0)
                state["requests"] += 1
                set_cookie = response.headers.get("set-cookie")
                if set_cookie:
                    headers["cookie"] = set_cookie.split(";", 1)[0]
                if response.status_code >= 400:
                    _error(state, f"{route}: HTTP {response.status_code}: {response.text[:200]!r}")
                    break
                if route == "/verify":
                    state["reward"] += _reward(response.content)
                    _episode_done(state)
    except _Stop:
        pass


def _error(state: dict, message: str) -> None:
    state["errors"] += 1
    state["first_error"] = state["first_error"] or message
    if state["errors"] >= state["max_errors"]:
        state["stop"] = True
        raise _Stop


def _episode_done(state: dict) -> None:
    state["episodes"] += 1
    if state["episodes"] >= state["max_episodes"] or time.perf_counter() >= state["deadline"]:
        state["stop"] = True
        raise _Stop


async def run_load_async(url: str, episodes: Sequence[list[tuple[str, bytes]]], client: str, concurrency: int,
               duration_s: float, max_episodes: int, max_errors: int) -> LoadResult:
    state: dict[str, Any] = {
        "stop": False, "episodes": 0, "requests": 0, "errors": 0, "first_error": None, "reward": 0.0,
        "latencies": [], "max_episodes": max_episodes, "max_errors": max_errors,
    }
    started = time.perf_counter()
    state["deadline"] = started + duration_s
    if client == "raw":
        workers = [_raw_worker(url, episodes, i, state) for i in range(concurrency)]
        await asyncio.wait_for(asyncio.gather(*workers), duration_s + 60)
    elif client == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=60.0, trust_env=False) as http:
            workers = [_httpx_worker(http, url, episodes, i, state) for i in range(concurrency)]
            await asyncio.wait_for(asyncio.gather(*workers), duration_s + 60)
    else:
        raise ValueError(f"client must be 'raw' or 'httpx', got {client!r}")
    elapsed = time.perf_counter() - started
    return LoadResult(
        client=client, concurrency=concurrency, episodes=state["episodes"], requests=state["requests"],
        errors=state["errors"], elapsed_s=elapsed, episodes_per_s=state["episodes"] / elapsed,
        first_error=state["first_error"], reward_sum=state["reward"], latencies_s=state["latencies"],
    )


def run_load(url: str, episodes: Sequence[list[tuple[str, bytes]]], *, client: str = "raw", concurrency: int = 64,
             duration_s: float = 3.0, max_episodes: int = 1_000_000, max_errors: int = 100) -> LoadResult:
    """Play scripted episodes against ``url`` for ``duration_s`` (or ``max_episodes``) with ``concurrency`` workers.

    :func:`run_load_async` is the same on a running loop (e.g. several servers at once).

    Args:
        url: The server's base URL.
        episodes: Per task, the ``(route, body)`` requests of one episode; workers cycle through them.
        client: ``"raw"`` (minimal asyncio HTTP/1.1) or ``"httpx"``.
        concurrency: Concurrent episodes (one connection each).
        duration_s: Stop starting new requests after this long.
        max_episodes: Stop after this many finished episodes.
        max_errors: Stop after this many failed requests.
    """
    return asyncio.run(run_load_async(url, episodes, client, concurrency, duration_s, max_episodes, max_errors))
