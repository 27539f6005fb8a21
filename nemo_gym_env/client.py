"""The one HTTP client of resources servers: async, one pool, explicit per-episode cookies.

Cookies are never stored in the shared pool: each episode holds its own :class:`CookieJar`
(a plain name -> value dict) which is sent with every call and updated from every
``Set-Cookie``, so thousands of concurrent episodes share connections but never sessions.
"""

from __future__ import annotations

import asyncio
import json
import re
from http.cookiejar import CookieJar as _StdCookieJar
from http.cookiejar import DefaultCookiePolicy
from typing import Any

import httpx

__all__ = ["CookieJar", "ServerError", "ResourcesClient", "shared_http_client", "TOOL_NAME_RE"]

CookieJar = dict[str, str]
"""One episode's cookies: name -> value."""

TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
"""What a tool route name may look like; anything else never reaches a URL."""

_RETRYABLE_BEFORE_SEND = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


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


def _no_cookie_jar() -> _StdCookieJar:
    # A jar whose policy accepts no domain: the shared pool never keeps a cookie.
    return _StdCookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


_shared: dict[int, httpx.AsyncClient] = {}


def shared_http_client(max_connections: int = 1024) -> httpx.AsyncClient:
    """The process-wide pooled client for the running loop (one pool per event loop)."""
    loop_id = id(asyncio.get_running_loop())
    client = _shared.get(loop_id)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            cookies=_no_cookie_jar(),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=30.0),
            timeout=httpx.Timeout(60.0, connect=10.0),
            trust_env=False,
        )
        _shared[loop_id] = client
    return client


def _update_jar(jar: CookieJar, response: httpx.Response) -> None:
    for header in response.headers.get_list("set-cookie"):
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


class ResourcesClient:
    """Calls one resources server's routes with an episode's cookie jar.

    Example:
        >>> client = ResourcesClient("http://127.0.0.1:8000")   # doctest: +SKIP
        >>> jar = {}
        >>> await client.post("/seed_session", row, jar)         # doctest: +SKIP
    """

    def __init__(self, base_url: str, *, timeout_s: float = 60.0, verify_timeout_s: float = 300.0,
                 connect_retries: int = 3, max_in_flight: int | None = None):
        self.base_url = base_url.rstrip("/")
        self.max_in_flight = max_in_flight
        self._limiter: asyncio.Semaphore | None = None
        self.timeout_s = timeout_s
        self.verify_timeout_s = verify_timeout_s
        self.connect_retries = connect_retries

    async def post_raw(self, route: str, body: Any, jar: CookieJar, *, task_index: int | None = None,
                       timeout_s: float | None = None) -> httpx.Response:
        """POST JSON to ``route`` with the jar's cookies; the jar takes the reply's cookies.

        Connection failures before the request was sent are retried (nothing reached the
        server, so even a tool call with side effects is safe to send again); anything after
        that is raised as :class:`ServerError`, never retried.
        """
        if self.max_in_flight is not None and self._limiter is None:
            self._limiter = asyncio.Semaphore(self.max_in_flight)
        if self._limiter is None:
            return await self._post(route, body, jar, task_index=task_index, timeout_s=timeout_s)
        async with self._limiter:
            return await self._post(route, body, jar, task_index=task_index, timeout_s=timeout_s)

    async def _post(self, route: str, body: Any, jar: CookieJar, *, task_index: int | None,
                    timeout_s: float | None) -> httpx.Response:
        client = shared_http_client()
        try:
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ServerError(f"request body is not JSON-serializable: {exc}", server=self.base_url,
                              route=route, task_index=task_index) from exc
        headers = {"content-type": "application/json"}
        if jar:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in jar.items())
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        delay = 0.1
        for attempt in range(self.connect_retries + 1):
            try:
                response = await client.post(self.base_url + route, content=content, headers=headers,
                                             timeout=timeout)
                break
            except _RETRYABLE_BEFORE_SEND as exc:
                if attempt == self.connect_retries:
                    raise ServerError(f"cannot connect ({type(exc).__name__}: {exc}); is the server running?",
                                      server=self.base_url, route=route, task_index=task_index) from exc
                await asyncio.sleep(delay)
                delay *= 2
            except httpx.TimeoutException as exc:
                raise ServerError(f"no answer within {timeout:g} s ({type(exc).__name__})",
                                  server=self.base_url, route=route, task_index=task_index) from exc
            except httpx.HTTPError as exc:
                raise ServerError(f"connection failed mid-request ({type(exc).__name__}: {exc}); the server "
                                  "may have crashed", server=self.base_url, route=route,
                                  task_index=task_index) from exc
        _update_jar(jar, response)
        return response

    async def post_json(self, route: str, body: Any, jar: CookieJar, *, task_index: int | None = None,
                        timeout_s: float | None = None) -> Any:
        """POST and return the decoded JSON reply; non-2xx or non-JSON replies raise :class:`ServerError`."""
        response = await self.post_raw(route, body, jar, task_index=task_index, timeout_s=timeout_s)
        if response.status_code >= 400:
            raise ServerError(f"HTTP {response.status_code}: {response.text[:500]}", server=self.base_url,
                              route=route, task_index=task_index, status_code=response.status_code)
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(f"reply is not JSON: {response.text[:200]!r}", server=self.base_url, route=route,
                              task_index=task_index, status_code=response.status_code) from exc

    async def seed_session(self, row: dict[str, Any], jar: CookieJar, *, task_index: int | None = None) -> Any:
        """``POST /seed_session`` with the whole row; sets the episode's session cookie."""
        return await self.post_json("/seed_session", row, jar, task_index=task_index)

    async def call_tool(self, name: str, arguments: Any, jar: CookieJar, *, task_index: int | None = None) -> str:
        """``POST /<name>``; the raw reply body, even a 4xx/5xx one, is the tool output the model sees."""
        response = await self.post_raw(f"/{name}", arguments, jar, task_index=task_index)
        return response.text

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
            response = await shared_http_client().get(self.base_url + "/", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.is_success
