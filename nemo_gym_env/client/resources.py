"""The client of resources servers: one episode's calls, with its own cookie jar, over the shared transport.

Cookies are never stored in the shared pool: each episode holds its own :class:`CookieJar`
(a plain name -> value dict) which is sent with every call and updated from every
``Set-Cookie``, so thousands of concurrent episodes share connections but never sessions.

Example:
    >>> client = ResourcesClient("http://127.0.0.1:8000")              # doctest: +SKIP
    >>> jar = {}
    >>> await client.seed_session(row, jar)                            # doctest: +SKIP
    >>> await client.call_tool("get_weather", '{"city": "Oslo"}', jar)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

from nemo_gym_env.client.transport import HttpClient, Reply
from nemo_gym_env.errors import ConnectFailed, ServerError, TransportError
from nemo_gym_env.protocol.defaults import REQUEST_TIMEOUT_S, VERIFY_TIMEOUT_S
from nemo_gym_env.protocol.keys import STEP_REWARD_HEADER

__all__ = ["STEP_REWARD_HEADER", "CookieJar", "Reply", "ResourcesClient", "ServerError", "ToolReply",
           "step_reward_problem", "verdict_problem"]

CookieJar = dict[str, str]
"""One episode's cookies: name -> value."""

_JSON = ("Content-Type", "application/json")
_NO_ROUTE = {"detail": "Not Found"}  # what FastAPI (and Starlette) answer for a path no route serves


class ToolReply(NamedTuple):
    """A tool route's reply: the body the model reads, the step reward it gave, whether the route exists."""

    output: str
    step_reward: float | None
    found: bool = True
    """False when the server has no such route (its framework's ``404 {"detail": "Not Found"}``)."""


def verdict_problem(reply: Any) -> str | None:
    """Why a verify reply cannot be used (what it says of ``reward``, ``reward_components``, ``mask_sample``), or None."""
    if not isinstance(reply, dict):
        return f"not a JSON object: {str(reply)[:200]}"
    reward = reply.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return f"no numeric 'reward': {str(reply)[:200]}"
    components = reply.get("reward_components")
    if components is not None:
        if not isinstance(components, dict):
            return f"'reward_components' must map names to numbers, got {type(components).__name__}"
        for name, value in components.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"reward component {str(name)[:80]!r} is {str(value)[:80]!r}, not a finite number"
    if "mask_sample" in reply and reply["mask_sample"] is not None and not isinstance(reply["mask_sample"], bool):
        return f"'mask_sample' must be true or false, got {str(reply['mask_sample'])[:80]!r}"
    return None


def step_reward_problem(values: list[str]) -> str | None:
    """Why the values of a reply's step-reward header are not one finite number, or None."""
    if len(values) != 1:
        return f"{len(values)} {STEP_REWARD_HEADER} headers; a reply gives at most one"
    text = values[0].strip()
    try:
        value = float(text)
    except ValueError:
        return f"{STEP_REWARD_HEADER}: {text[:80]!r} is not a number"
    if not math.isfinite(value):
        return f"{STEP_REWARD_HEADER}: {text[:80]!r} is not a finite number"
    return None


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

    Args:
        base_url: The server, ``http://host:port``.
        timeout_s: Timeout of a tool call or seed (from the moment the request has a connection).
        verify_timeout_s: Timeout of ``/verify``.
        connect_retries: Retries of a connection that could not be opened (nothing was sent,
            so even a tool call with side effects is safe to send again).
        max_in_flight: Bound on this client's concurrent requests.
    """

    def __init__(self, base_url: str, *, timeout_s: float = REQUEST_TIMEOUT_S, verify_timeout_s: float = VERIFY_TIMEOUT_S,
                 connect_retries: int = 3, max_in_flight: int | None = None):
        self.http = HttpClient(base_url, connect_retries=connect_retries, max_in_flight=max_in_flight)
        self.base_url = self.http.base_url
        self.timeout_s = timeout_s
        self.verify_timeout_s = verify_timeout_s

    @property
    def connect_retries(self) -> int:
        """Retries of a connection that could not be opened (nothing was sent)."""
        return self.http.connect_retries

    @connect_retries.setter
    def connect_retries(self, value: int) -> None:
        self.http.connect_retries = value

    async def post_raw(self, route: str, body: Any, jar: CookieJar, *, task_index: int | None = None,
                       timeout_s: float | None = None) -> Reply:
        """POST ``body`` as JSON to ``route`` with the jar's cookies; the jar takes the reply's cookies.

        Raises:
            ServerError: the body is not JSON, no connection, a broken or malformed reply, or a
                timeout; never for an HTTP error status (the caller reads ``status_code``).
        """
        try:
            content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ServerError(f"request body is not JSON-serializable: {exc}", server=self.base_url,
                              route=route, task_index=task_index) from exc
        return await self.post_bytes(route, content, jar, task_index=task_index, timeout_s=timeout_s)

    async def post_bytes(self, route: str, content: bytes, jar: CookieJar, *, task_index: int | None = None,
                         timeout_s: float | None = None) -> Reply:
        """POST ``content`` (JSON text already encoded) to ``route``; otherwise as :meth:`post_raw`."""
        headers = [_JSON]
        if jar:
            headers.append(("Cookie", "; ".join(f"{k}={v}" for k, v in jar.items())))
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        try:
            reply = await self.http.request("POST", route, content, headers=headers, timeout_s=timeout)
        except ConnectFailed as exc:
            raise ServerError(f"cannot connect ({exc}); is the server running?", server=self.base_url,
                              route=route, task_index=task_index) from exc
        except TimeoutError as exc:
            raise ServerError(f"no answer within {timeout:g} s", server=self.base_url, route=route,
                              task_index=task_index) from exc
        except TransportError as exc:
            raise ServerError(f"connection failed mid-request ({exc}); the server may have crashed",
                              server=self.base_url, route=route, task_index=task_index) from exc
        _update_jar(jar, reply)
        return reply

    async def post_json(self, route: str, body: Any, jar: CookieJar, *, task_index: int | None = None,
                        timeout_s: float | None = None) -> Any:
        """POST and return the decoded JSON reply; non-2xx or non-JSON replies raise :class:`ServerError`."""
        reply = await self.post_raw(route, body, jar, task_index=task_index, timeout_s=timeout_s)
        return self._json_of(reply, route, task_index)

    def _json_of(self, reply: Reply, route: str, task_index: int | None) -> Any:
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

    async def call_tool(self, name: str, arguments: str | Any, jar: CookieJar, *,
                        task_index: int | None = None) -> str:
        """``POST /<name>`` with the call's arguments: JSON text (as the model wrote it, sent as it
        is) or a JSON value.

        Returns the raw reply body, even a 4xx/5xx one: that is the tool output the model sees.

        Raises:
            ServerError: on ``410 Gone``: the server no longer has this episode's session (it
                restarted, or the session expired), so the episode cannot go on.
        """
        return (await self.call_tool_reply(name, arguments, jar, task_index=task_index))[0]

    async def call_tool_reply(self, name: str, arguments: str | Any, jar: CookieJar, *,
                              task_index: int | None = None) -> ToolReply:
        """:meth:`call_tool`, the step reward the route gave (:data:`STEP_REWARD_HEADER`) or None,
        and whether the route exists.

        Raises:
            ServerError: as :meth:`call_tool`; also for a step reward that is not one finite number.
        """
        if isinstance(arguments, str):
            reply = await self.post_bytes(f"/{name}", arguments.encode("utf-8"), jar, task_index=task_index)
        else:
            reply = await self.post_raw(f"/{name}", arguments, jar, task_index=task_index)
        if reply.status_code == 410:
            raise ServerError(f"session lost: {reply.text[:300]}", server=self.base_url, route=f"/{name}",
                              task_index=task_index, status_code=410)
        if reply.status_code == 404 and _is_no_route(reply):
            return ToolReply(reply.text, None, found=False)
        values = reply.header_values(STEP_REWARD_HEADER)
        if not values:
            return ToolReply(reply.text, None)
        problem = step_reward_problem(values)
        if problem is not None:
            raise ServerError(f"unusable step reward: {problem}", server=self.base_url, route=f"/{name}",
                              task_index=task_index)
        return ToolReply(reply.text, float(values[0]))

    async def verify(self, body: dict[str, Any], jar: CookieJar, *, task_index: int | None = None) -> dict[str, Any]:
        """``POST /verify``; returns the reply, which carries ``reward``.

        Raises:
            ServerError: the reply has no numeric ``reward``, or optional fields of the wrong
                kind: ``reward_components`` other than a map of names to finite numbers,
                ``mask_sample`` other than a boolean; or a step reward header (the route that
                ends the episode gives no step reward).
        """
        raw = await self.post_raw("/verify", body, jar, task_index=task_index, timeout_s=self.verify_timeout_s)
        if raw.status_code < 400 and raw.header_values(STEP_REWARD_HEADER):
            raise ServerError(f"a step reward ({STEP_REWARD_HEADER}) on /verify, the route that ends the episode: "
                              "the episode's reward is the reply's 'reward' (and 'reward_components')",
                              server=self.base_url, route="/verify", task_index=task_index)
        reply = self._json_of(raw, "/verify", task_index)
        problem = verdict_problem(reply)
        if problem is not None:
            raise ServerError(f"unusable verify reply: {problem}", server=self.base_url, route="/verify",
                              task_index=task_index)
        return reply

    async def health(self, timeout_s: float = 5.0) -> bool:
        """True when ``GET /`` answers 2xx."""
        try:
            reply = await self.http.request("GET", "/", timeout_s=timeout_s)
        except (ConnectFailed, TransportError, TimeoutError):
            return False
        return reply.is_success


def _is_no_route(reply: Reply) -> bool:
    try:
        return json.loads(reply.content) == _NO_ROUTE
    except ValueError:
        return False
