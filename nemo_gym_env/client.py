"""The one HTTP client of resources servers: async, one pool, explicit per-episode cookies.

Cookies are never stored in the shared pool: each episode holds its own :class:`CookieJar`
(a plain name -> value dict) which is sent with every call and updated from every
``Set-Cookie``, so thousands of concurrent episodes share connections but never sessions.

The transport is a small HTTP/1.1 keep-alive client on asyncio (``http://`` and
``https://``, no proxies, no redirects: exactly what a resources server needs). It replaced
httpx here because of what benchmarks/ measured at thousands of concurrent episodes:
httpcore's pool rescans every connection for every queued request, so its cost per
request grows with the pool (at 64 connections, 60% of the env's CPU went there; at 1024
the env crawled), and its per-request overhead alone was ~3x a bare request on a loaded
2-core machine. Here a connection is leased from a free list in O(1), a request is one
write, and a reply is parsed from one buffer.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import ssl
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MAX_CONNECTIONS_PER_SERVER", "TOOL_NAME_RE", "CookieJar", "Reply", "ResourcesClient", "ServerError"]

CookieJar = dict[str, str]
"""One episode's cookies: name -> value."""

TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
"""What a tool route name may look like; anything else never reaches a URL."""

MAX_CONNECTIONS_PER_SERVER = 1024
"""Open connections per server and event loop, shared by every client of the process."""

KEEPALIVE_S = 30.0
"""An idle pooled connection older than this is closed instead of reused."""

_MAX_HEAD_BYTES = 64 * 1024


class ServerError(RuntimeError):
    """A resources server could not be reached or answered unusably.

    Attributes name the server URL, the route and the task index so the message says
    where to look.
    """

    def __init__(self, message: str, *, server: str, route: str, task_index: int | None = None,
                 status_code: int | None = None):
        where = f"{server}{route}" + (f" (task {task_index})" if task_index is not None else "")
        super().__init__(f"{where}: {message}")
        self.server = server
        self.route = route
        self.task_index = task_index
        self.status_code = status_code


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


# ---- transport -----------------------------------------------------------------------------------


class _ConnectFailed(Exception):
    """Nothing was sent: the connection could not be opened (safe to retry)."""


class _ProtocolError(Exception):
    """The connection failed or the reply was malformed after the request was sent."""


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
        except (ValueError, IndexError, _ProtocolError) as exc:
            self._fail(_ProtocolError(f"malformed reply: {exc}"))

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
                    raise _ProtocolError(f"reply headers larger than {_MAX_HEAD_BYTES} bytes")
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
                    raise _ProtocolError(f"bad header line {line[:80]!r}")
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
                    raise _ProtocolError("conflicting Content-Length headers")
                self._length = int(lengths.pop()) if lengths else None
                if self._length is not None and self._length < 0:
                    raise _ProtocolError("negative Content-Length")
        if self._chunked:
            self._parse_chunks()
        elif self._length is not None and len(buf) >= self._length:
            if len(buf) > self._length:
                raise _ProtocolError("more bytes than Content-Length")
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
                    raise _ProtocolError("bytes after the last chunk")
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
            self._fail(_ProtocolError(f"undecodable compressed body: {exc}"))
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
        waiter.set_exception(_ProtocolError(why))

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
            raise _ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
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
        pool = pools[key] = _Pool(scheme, host, port, MAX_CONNECTIONS_PER_SERVER)
    return pool


def _update_jar(jar: CookieJar, reply: Reply) -> None:
    for header in reply.header_values("set-cookie"):
        pair, _, attributes = header.partition(";")
        name, sep, value = pair.partition("=")
        if not sep:
            continue
        name = name.strip()
        attrs = attributes.lower().replace(" ", "")
        if "max-age=0" in attrs or "expires=thu,01jan197000:00:00" in attrs:
            jar.pop(name, None)
        else:
            jar[name] = value.strip()


# ---- the client ----------------------------------------------------------------------------------


class ResourcesClient:
    """Calls one resources server's routes with an episode's cookie jar.

    Example:
        >>> client = ResourcesClient("http://127.0.0.1:8000")   # doctest: +SKIP
        >>> jar = {}
        >>> await client.post_json("/seed_session", row, jar)    # doctest: +SKIP
    """

    def __init__(self, base_url: str, *, timeout_s: float = 60.0, verify_timeout_s: float = 300.0,
                 connect_retries: int = 3, max_in_flight: int | None = None):
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path
        self._host_header = parts.netloc.rpartition("@")[2]
        self.max_in_flight = max_in_flight
        self._limiter: asyncio.Semaphore | None = None
        self.timeout_s = timeout_s
        self.verify_timeout_s = verify_timeout_s
        self.connect_retries = connect_retries

    async def post_raw(self, route: str, body: Any, jar: CookieJar, *, task_index: int | None = None,
                       timeout_s: float | None = None) -> Reply:
        """POST JSON to ``route`` with the jar's cookies; the jar takes the reply's cookies.

        Connection failures before the request was sent are retried (nothing reached the
        server, so even a tool call with side effects is safe to send again); anything after
        that is raised as :class:`ServerError`, never retried. ``timeout_s`` counts from the
        moment the request has a connection (waiting for a ``max_in_flight`` slot is not
        counted).
        """
        try:
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ServerError(f"request body is not JSON-serializable: {exc}", server=self.base_url,
                              route=route, task_index=task_index) from exc
        cookie = "; ".join(f"{k}={v}" for k, v in jar.items()) if jar else None
        if self.max_in_flight is not None and self._limiter is None:
            self._limiter = asyncio.Semaphore(self.max_in_flight)
        if self._limiter is None:
            reply = await self._request("POST", route, content, cookie, task_index, timeout_s)
        else:
            async with self._limiter:
                reply = await self._request("POST", route, content, cookie, task_index, timeout_s)
        _update_jar(jar, reply)
        return reply

    async def _request(self, method: str, route: str, content: bytes, cookie: str | None,
                       task_index: int | None, timeout_s: float | None) -> Reply:
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        lines = [f"{method} {self._prefix}{route} HTTP/1.1", f"Host: {self._host_header}",
                 "User-Agent: nemo-gym-env", "Accept: */*"]
        if method != "GET":
            lines += ["Content-Type: application/json", f"Content-Length: {len(content)}"]
        if cookie:
            lines.append(f"Cookie: {cookie}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")
        pool = _pool(self._scheme, self._host, self._port)
        delay = 0.1
        await pool.slots.acquire()
        conn: _Connection | None = None
        try:
            for attempt in range(self.connect_retries + 1):
                try:
                    conn = await pool.lease(min(timeout, 10.0))
                    break
                except _ConnectFailed as exc:
                    if attempt == self.connect_retries:
                        raise ServerError(f"cannot connect ({exc}); is the server running?", server=self.base_url,
                                          route=route, task_index=task_index) from exc
                    await asyncio.sleep(delay)
                    delay *= 2
            assert conn is not None
            try:
                async with asyncio.timeout(timeout):
                    reply = await conn.send(head, content, no_body=method == "HEAD")
            except TimeoutError as exc:
                conn.close()
                raise ServerError(f"no answer within {timeout:g} s", server=self.base_url, route=route,
                                  task_index=task_index) from exc
            except _ProtocolError as exc:
                conn.close()
                raise ServerError(f"connection failed mid-request ({exc}); the server may have crashed",
                                  server=self.base_url, route=route, task_index=task_index) from exc
            except BaseException:  # cancelled: the reply may still come, so the connection is unusable
                conn.close()
                raise
            conn.finished()
            return reply
        finally:
            pool.give_back(conn)

    async def post_json(self, route: str, body: Any, jar: CookieJar, *, task_index: int | None = None,
                        timeout_s: float | None = None) -> Any:
        """POST and return the decoded JSON reply; non-2xx or non-JSON replies raise :class:`ServerError`."""
        reply = await self.post_raw(route, body, jar, task_index=task_index, timeout_s=timeout_s)
        if reply.status_code >= 400:
            raise ServerError(f"HTTP {reply.status_code}: {reply.text[:500]}", server=self.base_url,
                              route=route, task_index=task_index, status_code=reply.status_code)
        try:
            return reply.json()
        except ValueError as exc:
            raise ServerError(f"reply is not JSON: {reply.text[:200]!r}", server=self.base_url, route=route,
                              task_index=task_index, status_code=reply.status_code) from exc

    async def seed_session(self, row: dict[str, Any], jar: CookieJar, *, task_index: int | None = None) -> Any:
        """``POST /seed_session`` with the whole row; sets the episode's session cookie."""
        return await self.post_json("/seed_session", row, jar, task_index=task_index)

    async def call_tool(self, name: str, arguments: Any, jar: CookieJar, *, task_index: int | None = None) -> str:
        """``POST /<name>``; the raw reply body, even a 4xx/5xx one, is the tool output the model sees.

        Raises:
            ServerError: on ``410 Gone``: the server no longer has this episode's session (it
                restarted, or the session expired), so the episode cannot go on.
        """
        reply = await self.post_raw(f"/{name}", arguments, jar, task_index=task_index)
        if reply.status_code == 410:
            raise ServerError(f"session lost: {reply.text[:300]}", server=self.base_url, route=f"/{name}",
                              task_index=task_index, status_code=410)
        return reply.text

    async def verify(self, body: dict[str, Any], jar: CookieJar, *, task_index: int | None = None) -> dict[str, Any]:
        """``POST /verify``; returns the reply, which carries ``reward``."""
        reply = await self.post_json("/verify", body, jar, task_index=task_index, timeout_s=self.verify_timeout_s)
        if not isinstance(reply, dict) or not isinstance(reply.get("reward"), (int, float)):
            raise ServerError(f"verify reply has no numeric 'reward': {str(reply)[:200]}", server=self.base_url,
                              route="/verify", task_index=task_index)
        return reply

    async def health(self, timeout_s: float = 5.0) -> bool:
        """True when ``GET /`` answers 2xx."""
        try:
            reply = await self._request("GET", "/", b"", None, None, timeout_s)
        except ServerError:
            return False
        return reply.is_success
