"""The one HTTP transport of the package: HTTP/1.1 keep-alive on asyncio, one pool per origin.

Every HTTP request the env, the vector env, the rollout collector and the HTTP policies make
goes through :class:`HttpClient`. It speaks exactly what a resources server or a model endpoint
needs: ``http://`` and ``https://``, keep-alive, ``Content-Length`` and chunked replies,
gzip/deflate bodies; no proxies, no redirects, no cookie store (callers keep their own).

Why a hand-written transport and not a library: ``benchmarks/README.md`` keeps the figures.
httpx's pool (httpcore) rescans every connection for every queued request, so its cost per
request grows with the pool: at 64 connections 60% of the env's CPU went there, and at 1024
the env crawled. Here a connection is leased from a free list in O(1), a request is one write,
and a reply is parsed from one buffer.

Example:
    >>> from nemo_gym_env.client.loop import background_loop
    >>> http = HttpClient("http://127.0.0.1:8000")                       # doctest: +SKIP
    >>> reply = background_loop().run(http.request("GET", "/"))          # doctest: +SKIP
    >>> reply.status_code, reply.json()                                  # doctest: +SKIP
    (200, {'status': 'ok'})
"""

from __future__ import annotations

import asyncio
import json
import select
import ssl
import time
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from nemo_gym_env.errors import ConnectFailed, TransportError

__all__ = ["MAX_CONNECTIONS_PER_ORIGIN", "ConnectFailed", "HttpClient", "Reply", "TransportError"]

MAX_CONNECTIONS_PER_ORIGIN = 1024
"""Open connections per origin and event loop, shared by every client of the process."""

KEEPALIVE_S = 30.0
"""An idle pooled connection older than this is closed instead of reused."""

_MAX_HEAD_BYTES = 64 * 1024


@dataclass
class Reply:
    """A server's HTTP reply: status, headers (names lower-case, in order) and body bytes."""

    status_code: int
    headers: list[tuple[str, str]]
    content: bytes

    def header_values(self, name: str) -> list[str]:
        """Every value of header ``name`` (lower-case), in order."""
        return [v for k, v in self.headers if k == name]

    @property
    def text(self) -> str:
        """The body decoded with the ``Content-Type`` charset (UTF-8 when none is given)."""
        charset = "utf-8"
        for value in self.header_values("content-type"):
            for param in value.split(";")[1:]:
                key, _, val = param.strip().partition("=")
                if key.lower() == "charset" and val:
                    charset = val.strip('"')
        try:
            return self.content.decode(charset, errors="replace")
        except LookupError:
            return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not)."""
        return json.loads(self.content)

    @property
    def is_success(self) -> bool:
        """2xx."""
        return 200 <= self.status_code < 300


# ---- connections and pools ------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time, the reply parsed incrementally."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = time.monotonic()
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Reply] | None = None
        self._no_body = False
        self._head: tuple[int, list[tuple[str, str]], bool] | None = None  # status, headers, keep-alive
        self._length: int | None = None
        self._chunked = False
        self._chunks: list[bytes] = []
        self._scan = 0
        self.reusable = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        self._buffer += data
        try:
            self._parse()
        except (ValueError, IndexError, TransportError) as exc:
            self._fail(TransportError(f"malformed reply: {exc}"))

    def eof_received(self) -> bool:
        self._lost("the server closed the connection before a complete reply")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(f"connection lost ({type(exc).__name__}: {exc})" if exc else "the server closed the connection")

    # requests

    def send(self, head: bytes, body: bytes, *, no_body: bool) -> asyncio.Future[Reply]:
        """Write one request; the returned future gets its reply."""
        assert self.transport is not None and self._waiter is None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._no_body = no_body
        self._buffer.clear()
        self._head, self._length, self._chunked, self._chunks, self._scan = None, None, False, [], 0
        self.reusable = False
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return self._waiter

    def finished(self) -> None:
        """The reply was taken: ready for the next request (or closed when not reusable)."""
        self._waiter = None
        self.idle_since = time.monotonic()
        if not self.reusable:
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def peer_gone(self) -> bool:
        """Whether an idle connection has become readable: the server closed it (EOF) or is out of step.

        The event loop notices a server's FIN on its own when it is idle, but a busy loop may
        not have run its selector since; asking the socket directly avoids sending a request
        into a connection that is already closing (as httpcore does).
        """
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        try:
            poller = select.poll()  # not select.select(): it fails on descriptors above 1023
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    # parsing

    def _parse(self) -> None:
        buf = self._buffer
        while self._head is None:
            end = buf.find(b"\r\n\r\n", max(0, self._scan - 3))
            if end < 0:
                if len(buf) > _MAX_HEAD_BYTES:
                    raise TransportError(f"reply headers larger than {_MAX_HEAD_BYTES} bytes")
                self._scan = len(buf)
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            del buf[: end + 4]
            self._scan = 0
            version, status_text = lines[0].split(" ", 1)
            status = int(status_text[:3])
            if 100 <= status < 200:  # interim reply (100 Continue...): the real one follows
                continue
            headers = []
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    raise TransportError(f"bad header line {line[:80]!r}")
                headers.append((name.strip().lower(), value.strip()))
            connection = ",".join(v for k, v in headers if k == "connection").lower()
            keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
            self._head = (status, headers, keep_alive)
            if self._no_body or status in (204, 304):
                self._length = 0
            elif any(k == "transfer-encoding" and "chunked" in v.lower() for k, v in headers):
                self._chunked = True
            else:
                lengths = {v for k, v in headers if k == "content-length"}
                if len(lengths) > 1:
                    raise TransportError("conflicting Content-Length headers")
                self._length = int(lengths.pop()) if lengths else None
                if self._length is not None and self._length < 0:
                    raise TransportError("negative Content-Length")
        if self._chunked:
            self._parse_chunks()
        elif self._length is not None and len(buf) >= self._length:
            if len(buf) > self._length:
                raise TransportError("more bytes than Content-Length")
            self._complete(bytes(buf), self._head[2])

    def _parse_chunks(self) -> None:
        buf = self._buffer
        while True:
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return
            size = int(bytes(buf[:line_end]).split(b";", 1)[0].strip(), 16)
            if size == 0:  # the last chunk; then optional trailer lines and an empty line
                start = line_end + 2
                if buf[start: start + 2] == b"\r\n":
                    end = start + 2
                else:
                    found = buf.find(b"\r\n\r\n", start)
                    if found < 0:
                        return
                    end = found + 4
                if len(buf) > end:
                    raise TransportError("bytes after the last chunk")
                self._complete(b"".join(self._chunks), self._head[2])  # type: ignore[index]
                return
            if len(buf) < line_end + 2 + size + 2:
                return
            self._chunks.append(bytes(buf[line_end + 2: line_end + 2 + size]))
            del buf[: line_end + 2 + size + 2]

    def _complete(self, body: bytes, keep_alive: bool) -> None:
        status, headers, _ = self._head  # type: ignore[misc]
        try:
            body = _decode(body, headers)
        except zlib.error as exc:
            self._fail(TransportError(f"undecodable compressed body: {exc}"))
            return
        self.reusable = keep_alive
        self._buffer.clear()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(Reply(status, headers, body))

    def _lost(self, why: str) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._head is not None and self._length is None and not self._chunked:
            self._complete(bytes(self._buffer), False)  # a body delimited by the end of the connection
            return
        waiter.set_exception(TransportError(why))

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()


def _decode(body: bytes, headers: list[tuple[str, str]]) -> bytes:
    # We ask for no compression; a server that compresses anyway is still understood.
    for name, value in headers:
        if name == "content-encoding":
            for coding in reversed([c.strip().lower() for c in value.split(",")]):
                if coding in ("gzip", "x-gzip"):
                    body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
                elif coding == "deflate":
                    try:
                        body = zlib.decompress(body)
                    except zlib.error:
                        body = zlib.decompress(body, -zlib.MAX_WBITS)
    return body


class _Pool:
    """Keep-alive connections to one origin, leased in O(1) from a free list."""

    def __init__(self, scheme: str, host: str, port: int, max_connections: int):
        self.scheme, self.host, self.port = scheme, host, port
        self.idle: deque[_Connection] = deque()
        self.slots = asyncio.Semaphore(max_connections)

    async def lease(self, connect_timeout: float) -> _Connection:
        """An idle connection, or a new one; the caller holds a slot and must call :meth:`give_back`."""
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()  # the most recently used is the least likely to have been closed
            idle_s = now - conn.idle_since
            if not conn.closed and idle_s < KEEPALIVE_S and (idle_s < 1.0 or not conn.peer_gone()):
                return conn
            conn.close()
        loop = asyncio.get_running_loop()
        ssl_context = _ssl_context() if self.scheme == "https" else None
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=ssl_context,
                    server_hostname=self.host if ssl_context else None,
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        return conn

    def give_back(self, conn: _Connection | None) -> None:
        if conn is not None:
            if conn.reusable and not conn.closed:
                self.idle.append(conn)
            else:
                conn.close()
        self.slots.release()


_ssl: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    global _ssl
    if _ssl is None:
        _ssl = ssl.create_default_context()
    return _ssl


_pools: dict[int, tuple[asyncio.AbstractEventLoop, dict[tuple[str, str, int], _Pool]]] = {}


def _pool(scheme: str, host: str, port: int) -> _Pool:
    """The process-wide pool of one origin for the running loop (one pool per loop and server)."""
    loop = asyncio.get_running_loop()
    entry = _pools.get(id(loop))
    if entry is None or entry[0] is not loop:
        for key in [k for k, (other, _) in _pools.items() if other.is_closed()]:
            del _pools[key]  # a finished asyncio.run(): let its connections be collected
        entry = _pools[id(loop)] = (loop, {})
    pools = entry[1]
    key = (scheme, host, port)
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = _Pool(scheme, host, port, MAX_CONNECTIONS_PER_ORIGIN)
    return pool




# ---- the client --------------------------------------------------------------------------------------


class HttpClient:
    """Requests to one origin (scheme, host, port and a path prefix) over the process-wide pool.

    Connection failures before anything was sent are retried with backoff; nothing after that
    is (the request may have reached the server). A client holds no connections of its own:
    every client of an origin on the same event loop shares one pool.

    Args:
        base_url: ``http://host:port[/prefix]`` or ``https://...``.
        connect_retries: How many times to retry a connection that could not be opened.
        max_in_flight: Bound on this client's concurrent requests (None: only the pool's).
    """

    def __init__(self, base_url: str, *, connect_retries: int = 3, max_in_flight: int | None = None):
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path
        self._host_header = parts.netloc.rpartition("@")[2]
        self.connect_retries = connect_retries
        self.max_in_flight = max_in_flight
        self._limiter: asyncio.Semaphore | None = None

    async def request(self, method: str, path: str, body: bytes = b"", *,
                      headers: Sequence[tuple[str, str]] = (), timeout_s: float = 60.0) -> Reply:
        """Send one request and return the reply, whatever its status.

        ``timeout_s`` counts from the moment the request has a connection (waiting for a
        ``max_in_flight`` slot or a pool slot is not counted).

        Raises:
            ConnectFailed: No connection could be opened, after the retries.
            TransportError: The connection failed, or the reply was malformed, after sending.
            TimeoutError: No complete reply within ``timeout_s``.
        """
        if self.max_in_flight is not None and self._limiter is None:
            self._limiter = asyncio.Semaphore(self.max_in_flight)
        if self._limiter is None:
            return await self._send(method, path, body, headers, timeout_s)
        async with self._limiter:
            return await self._send(method, path, body, headers, timeout_s)

    async def _send(self, method: str, path: str, body: bytes, headers: Sequence[tuple[str, str]],
                    timeout_s: float) -> Reply:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self._host_header}",
                 "User-Agent: nemo-gym-env", "Accept: */*"]
        if method not in ("GET", "HEAD"):
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{name}: {value}" for name, value in headers]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")
        pool = _pool(self.scheme, self.host, self.port)
        delay = 0.1
        await pool.slots.acquire()
        conn: _Connection | None = None
        try:
            for attempt in range(self.connect_retries + 1):
                try:
                    conn = await pool.lease(min(timeout_s, 10.0))
                    break
                except ConnectFailed:
                    if attempt == self.connect_retries:
                        raise
                    await asyncio.sleep(delay)
                    delay *= 2
            assert conn is not None
            try:
                async with asyncio.timeout(timeout_s):
                    reply = await conn.send(head, body, no_body=method == "HEAD")
            except BaseException:  # timed out, failed or cancelled: the reply may still come
                conn.close()
                raise
            conn.finished()
            return reply
        finally:
            pool.give_back(conn)
