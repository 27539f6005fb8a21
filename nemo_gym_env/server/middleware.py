"""The hardening every resources server gets: guarded verify, error replies, session ids, body limits.

:class:`~nemo_gym_env.server.base.SimpleResourcesServer` installs these on its app; a server
author never touches them. What they do, and why:

- :func:`guard_verify`: a verifier that raises, or returns a non-finite reward, gives reward 0
  with ``failure_kind``/``failure_reason`` instead of a 500 that would fail a training batch;
- :func:`install_error_handlers`: a bad body gets a 422 whose ``error`` names the server, the
  route and the field; a lost session 410; a body nested too deeply or holding what JSON cannot
  encode 400; :class:`CatchAllMiddleware`: anything else 500 with the exception's type, logged
  with its traceback, and the connection kept open;
- :class:`SessionCookieMiddleware`: every request's signed session holds an id, a cookie this
  launch did not sign meets :class:`LostSession` (410 on any read of the id), and ``/verify``
  frees the session's state;
- :class:`BodyLimitMiddleware`: bodies over the limit get 413 before they are read whole.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import inspect
import json
import logging
import math
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from itsdangerous import BadSignature, TimestampSigner
from pydantic_core import PydanticSerializationError
from starlette.middleware.sessions import Session

from nemo_gym_env.errors import SessionLostError
from nemo_gym_env.protocol.types import BaseVerifyRequest

__all__ = [
    "SESSION_ID_KEY",
    "BodyLimitMiddleware",
    "CatchAllMiddleware",
    "LostSession",
    "SessionCookieMiddleware",
    "TypedSeedMiddleware",
    "add_lifespan",
    "failed_reply",
    "guard_verify",
    "install_error_handlers",
    "read_body",
    "replay_body",
    "typed_seed",
    "zero_reward_reply",
]

logger = logging.getLogger("nemo_gym_env.server")

SESSION_ID_KEY = "session_id"
"""Key of the session id inside the signed cookie, as in NeMo Gym."""


def guard_verify(verify: Any) -> Any:
    """Wrap ``verify`` so a raising or non-finite verifier gives reward 0 with a reason, not a 500."""

    @functools.wraps(verify)
    async def verify_route(*args: Any, **kwargs: Any) -> Any:
        body = next((v for v in kwargs.values() if isinstance(v, BaseVerifyRequest)), None)
        try:
            result = await verify(*args, **kwargs)
        except SessionLostError:
            raise  # not the verifier's fault: this episode's state is gone, there is nothing to score
        except Exception as exc:  # a verifier bug must not fail a training batch
            logger.error("verify raised: %s", traceback.format_exc())
            return zero_reward_reply(body, "verifier_error", f"{type(exc).__name__}: {exc}")
        reward = getattr(result, "reward", None) if not isinstance(result, Mapping) else result.get("reward")
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            return zero_reward_reply(body, "invalid_reward", f"verifier returned a non-finite reward: {reward!r}")
        return result

    # Resolve string annotations (``from __future__ import annotations`` in the server's
    # module) here, where the server's globals are known, so FastAPI sees real types.
    verify_route.__signature__ = inspect.signature(verify, eval_str=True)  # type: ignore[attr-defined]
    return verify_route


def add_lifespan(app: FastAPI, context: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
    """Run ``context()`` around the app's life (entered at start-up, left at shutdown), inside what it had."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with context(), inner(app_) as state:
            yield state

    app.router.lifespan_context = lifespan


def zero_reward_reply(body: BaseVerifyRequest | None, kind: str, reason: str) -> JSONResponse:
    """The verify request echoed back with reward 0 and why (``failure_kind``, ``failure_reason``).

    A body that cannot be echoed (nested past the serializer's depth limit) is the client's fault: 400.
    """
    try:
        echoed = body.model_dump(mode="json") if body is not None else {}
    except (ValueError, RecursionError) as exc:  # PydanticSerializationError is a ValueError
        return JSONResponse({"error": f"POST /verify: the body cannot be echoed back ({exc})"}, status_code=400)
    return JSONResponse({**echoed, "reward": 0.0, "failure_kind": kind, "failure_reason": reason})


def install_error_handlers(app: FastAPI, server_name: str) -> None:
    """Error replies naming ``server_name`` (e.g. ``"WeatherServer (weather)"``); see the module docstring."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = (
            f"{server_name}: invalid body for POST {request.url.path}: {where}: {first.get('msg', 'invalid')}"
        )
        detail = [{k: e.get(k) for k in ("type", "loc", "msg")} for e in errors[:20]]
        return JSONResponse({"error": message, "detail": detail}, status_code=422)

    @app.exception_handler(SessionLostError)
    async def _session_lost(request: Request, exc: SessionLostError) -> JSONResponse:
        return JSONResponse({"error": f"{server_name}: POST {request.url.path}: {exc}"}, status_code=410)

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        return JSONResponse(
            {"error": f"{server_name}: body of POST {request.url.path} is nested too deeply"}, status_code=400
        )

    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return failed_reply(server_name, request.url.path, exc)

    # A reply that echoes the body (``/verify`` does) cannot be encoded when the body held a lone
    # UTF-16 surrogate escape ("\ud800") or was nested past the serializer's depth limit: the
    # client's input is at fault, so it is a 400, not a 500 (found by tests/reliability).
    @app.exception_handler(PydanticSerializationError)
    @app.exception_handler(UnicodeEncodeError)
    async def _unencodable(request: Request, exc: ValueError) -> JSONResponse:
        text = str(exc)
        if "surrogates not allowed" in text:
            why = "holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair), which is not text"
        elif "depth exceeded" in text:
            why = "is nested too deeply"
        else:
            return await _unhandled(request, exc)
        return JSONResponse({"error": f"{server_name}: body of POST {request.url.path} {why}"}, status_code=400)


def failed_reply(server_name: str, path: str, exc: BaseException) -> JSONResponse:
    """The 500 of a route that raised ``exc`` (logged with its traceback), naming the error."""
    logger.error("%s: POST %s raised: %s", server_name, path, "".join(traceback.format_exception(exc)))
    return JSONResponse({"error": f"{server_name}: {path} failed: {type(exc).__name__}: {exc}"}, status_code=500)


class CatchAllMiddleware:
    """Pure ASGI: a route that raises gets a 500 naming the error, and its connection lives on.

    Starlette's catch-all handler answers 500 but then raises the error again to the server,
    which closes the connection; a client that had already taken that keep-alive connection for
    its next request then meets a reset, for a request that never reached a route. Caught here,
    inside that handler, the error never gets that far. (A route that fails after its reply has
    started cannot be answered again: that error goes on as before.)
    """

    def __init__(self, app: Any, server_name: str):
        self.app = app
        self.server_name = server_name

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001 - every route error becomes a reply, not a dropped connection
            if started:
                raise
            await failed_reply(self.server_name, scope.get("path", ""), exc)(scope, receive, send)


class LostSession(dict):
    """``request.session`` of a request whose cookie did not verify: asking for the id raises.

    It stays empty, so no new cookie is sent: every later request of that client meets the
    same 410 instead of silently landing in a fresh session.
    """

    accessed = False
    modified = False

    def __getitem__(self, key: Any) -> Any:
        if key == SESSION_ID_KEY:
            raise SessionLostError(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key == SESSION_ID_KEY:
            raise SessionLostError(key)
        return super().get(key, default)


def _cookie(scope: dict, name: bytes) -> bytes | None:
    """The value of the request's cookie called ``name`` (None: it sent none); the last one when it sent several,
    as Starlette reads cookies."""
    found = None
    for header, value in scope.get("headers", ()):
        if header == b"cookie":
            for part in value.split(b";"):
                key, sep, cookie = part.partition(b"=")
                if sep and key.strip() == name:
                    found = cookie.strip().strip(b'"')
    return found


class SessionCookieMiddleware:
    """Pure ASGI: the signed session cookie, an id in every session, and ``/verify`` freeing its state.

    The cookie is Starlette's ``SessionMiddleware`` cookie, byte for byte (the session as base64
    JSON, signed with itsdangerous' ``TimestampSigner``; ``Max-Age``, ``httponly``,
    ``samesite=lax``), re-sent on every reply as NeMo Gym's clients expect. A request without a
    session cookie, or any ``/seed_session``, gets a new id; a request whose cookie did not verify
    (forged, expired, from another launch) gets a :class:`LostSession`.

    What repeats per request is remembered, for a second or two: a cookie's verdict (the same bytes
    verify the same way; the age of one that verified is checked at every use), and the signature of
    a session made within the same second (the signer's clock has one-second steps, so it would be
    the same). A client sends back the cookie of the reply before, so that is all that is reused; the
    memories hold what the last two seconds' requests asked, at most ``cache_size`` a second.
    """

    def __init__(self, app: Any, secret_key: str, cookie_name: str, max_age: int,
                 release_session: Callable[[str], None], cache_size: int = 16_384):
        self.app = app
        self.signer = TimestampSigner(secret_key)
        self.name = cookie_name.encode("latin-1")
        self.max_age = max_age
        self.release_session = release_session
        self.attributes = f"; path=/; Max-Age={max_age}; httponly; samesite=lax".encode("latin-1")
        self._verified = _RecentMemo(self._unsign, cache_size, keep_previous=True)
        self._signed = _RecentMemo(self.signer.sign, cache_size, keep_previous=False)  # the signer reads the clock

    def _unsign(self, cookie: bytes) -> tuple[str, int] | None:
        """``(session JSON, signed at)`` of a cookie whose signature verifies (its age not checked), else None."""
        try:
            value, signed_at = self.signer.unsign(cookie, return_timestamp=True)
            text = base64.b64decode(value).decode("utf-8")
            if not isinstance(json.loads(text), dict):
                return None
        except (BadSignature, ValueError, RecursionError):  # binascii.Error is a ValueError
            return None
        return text, int(signed_at.timestamp())

    def _session(self, cookie: bytes) -> dict | None:
        """The session ``cookie`` carries, None when it does not verify or is older than ``max_age``."""
        now = int(time.time())
        known = self._verified(cookie, now)
        if known is None or not 0 <= now - known[1] <= self.max_age:
            return None
        return json.loads(known[0])

    def _sign(self, session: dict) -> bytes:
        return self._signed(base64.b64encode(json.dumps(session).encode("utf-8")), int(time.time()))

    def open(self, scope: dict) -> tuple[Session, str, bool] | None:
        """``(session, its id, whether the request carried it)``; None when the request's cookie did not verify
        (forged, expired, from another launch) and the route is not ``/seed_session``: a lost session."""
        cookie = _cookie(scope, self.name)
        carried = self._session(cookie) if cookie is not None else None
        session_id = carried.get(SESSION_ID_KEY) if carried is not None else None
        if not isinstance(session_id, str):
            if cookie is not None and scope.get("path") != "/seed_session":
                return None
            session_id = str(uuid.uuid4())
            scope.setdefault("state", {})["new_session"] = True
        session = Session(carried or {})
        session[SESSION_ID_KEY] = session_id  # always assigned, so the cookie is re-sent on every reply
        return session, session_id, carried is not None

    def reply_headers(self, headers: Any, session: dict, started: bool) -> list[tuple[bytes, bytes]]:
        """A reply's headers with ``Vary: Cookie`` and the session's cookie (or its removal) added."""
        headers = list(headers)
        vary = next((i for i, (key, _) in enumerate(headers) if key.lower() == b"vary"), None)
        if vary is None:
            headers.append((b"vary", b"Cookie"))
        else:
            headers[vary] = (b"vary", headers[vary][1] + b", Cookie")
        if session:
            headers.append((b"set-cookie", self.name + b"=" + self._sign(session) + self.attributes))
        elif started:  # the route cleared the session
            headers.append((b"set-cookie", self.name + b"=null; path=/; expires=Thu, 01 Jan 1970 00:00:00 GMT; "
                                                       b"httponly; samesite=lax"))
        return headers

    def with_cookie(self, send: Any, session: dict, started: bool) -> Any:
        """``send``, adding the session's headers to the reply's start."""

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": self.reply_headers(message.get("headers", ()), session, started)}
            await send(message)

        return send_with_cookie

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        opened = self.open(scope)
        if opened is None:
            scope["session"] = LostSession()  # empty and unmodified: no cookie goes back
            await self.app(scope, receive, send)
            return
        session, session_id, started = opened
        scope["session"] = session
        try:
            await self.app(scope, receive, self.with_cookie(send, session, started))
        finally:
            if scope.get("path") == "/verify":
                self.release_session(session_id)


class _RecentMemo:
    """``compute(key)``, remembered for the second it was asked in (and the next, with ``keep_previous``).

    Memory follows the request rate, not the run's length: each second starts an empty memory, so what
    a client no longer sends is forgotten within two seconds. At most ``limit`` answers a second are kept.
    """

    def __init__(self, compute: Callable[[Any], Any], limit: int, *, keep_previous: bool):
        self.compute = compute
        self.limit = limit
        self.keep_previous = keep_previous
        self.second = -1
        self.current: dict[Any, Any] = {}
        self.previous: dict[Any, Any] = {}

    def __call__(self, key: Any, second: int) -> Any:
        if second != self.second:
            self.previous = self.current if self.keep_previous and second == self.second + 1 else {}
            self.current, self.second = {}, second
        try:
            return self.current[key]
        except KeyError:
            pass
        value = self.previous[key] if key in self.previous else self.compute(key)
        if len(self.current) < self.limit:
            self.current[key] = value
        return value


class TypedSeedMiddleware:
    """Pure ASGI: ``/seed_session`` also takes NeMo Gym 0.7's typed body, for every server.

    ``{resources_session_id, episode_id: {rollout_id, attempt}, task_id: {taskset, task_id},
    task_data}`` is checked (a 422 names the field; NeMo Gym silently treats a malformed typed
    body as a row), then the server's own ``seed_session`` gets ``task_data`` as the row it
    always gets, and a successful reply becomes ``{resources_session_id, resources_tools: null,
    sandbox_access: null}``, its cookie kept. A row body passes untouched.

    NeMo Gym 0.7's session contract for typed ids is kept (a bounded ledger of the last
    ``max_ids`` ids): the same seed again is answered as the first; a seed of an open id for
    another episode or task, and any seed of an id that ``/close_session`` closed (seeded or
    not), get ``409``.
    """

    TYPED_KEYS = frozenset({"resources_session_id", "episode_id", "task_id", "task_data"})

    def __init__(self, app: Any, max_ids: int = 100_000):
        self.app = app
        self.max_ids = max_ids
        self.ledger: OrderedDict[str, tuple[str, bool]] = OrderedDict()  # id -> (episode and task, closed)

    def _note(self, session_id: str, key: str, closed: bool) -> None:
        self.ledger[session_id] = (key, closed)
        self.ledger.move_to_end(session_id)
        while len(self.ledger) > self.max_ids:
            self.ledger.popitem(last=False)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in ("/seed_session", "/close_session") or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return
        if path == "/close_session":
            closing = _json_object(body).get("resources_session_id")
            if isinstance(closing, str) and closing:
                self._note(closing, self.ledger.get(closing, ("", False))[0], True)
            await self.app(scope, replay_body(body, receive), send)
            return
        typed = typed_seed(body)
        if typed is None:
            await self.app(scope, replay_body(body, receive), send)
            return
        problem, session_id, row = typed
        if problem is not None:
            await _send_json(send, 422, {"error": f"POST /seed_session: invalid typed seed body: {problem}"})
            return
        data = _json_object(body)
        key = json.dumps([data.get("episode_id"), data.get("task_id")], sort_keys=True)
        known = self.ledger.get(session_id)
        if known is not None and (known[1] or known[0] != key):
            why = "is closed" if known[1] else "is already seeded for another episode or task"
            await _send_json(send, 409, {"error": f"POST /seed_session: resources session {session_id!r} {why}"})
            return
        row_bytes = json.dumps(row).encode()
        scope = {**scope, "headers": [(k, str(len(row_bytes)).encode() if k == b"content-length" else v)
                                      for k, v in scope.get("headers", ())]}
        start: dict | None = None

        async def rewrite(message: dict) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] == "http.response.body" and start is not None:
                if message.get("more_body", False):
                    return  # seed replies are small: the whole body is rebuilt below
                status = start["status"]
                if 200 <= status < 300:
                    self._note(session_id, key, False)
                reply = (json.dumps({"resources_session_id": session_id, "resources_tools": None,
                                     "sandbox_access": None}).encode() if 200 <= status < 300
                         else message.get("body", b""))
                headers = [(k, str(len(reply)).encode() if k == b"content-length" else v)
                           for k, v in start.get("headers", [])]
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": reply})
                return
            await send(message)

        await self.app(scope, replay_body(row_bytes, receive), rewrite)


def typed_seed(body: bytes) -> tuple[str | None, str, dict] | None:
    """``(problem or None, resources_session_id, row)`` of a typed seed body; None for a row body."""
    if b"task_data" not in body and b"\\u" not in body:  # neither the key nor an escape that could spell it
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the route's own validation answers it
    if not isinstance(data, dict) or "resources_session_id" not in data or "task_data" not in data:
        return None
    session_id = data.get("resources_session_id")
    extra = sorted(set(data) - TypedSeedMiddleware.TYPED_KEYS)
    episode, task = data.get("episode_id"), data.get("task_id")
    if extra:
        return f"unknown field(s) {extra}", "", {}
    if not isinstance(session_id, str) or not session_id:
        return "resources_session_id: a non-empty string is required", "", {}
    if not isinstance(episode, dict) or not isinstance(episode.get("rollout_id"), str) or not isinstance(
            episode.get("attempt", 0), int) or isinstance(episode.get("attempt", 0), bool):
        return "episode_id: {rollout_id: str, attempt: int} is required", "", {}
    if not isinstance(task, dict) or not all(isinstance(task.get(k), str) and task.get(k) for k in ("taskset",
                                                                                                     "task_id")):
        return "task_id: {taskset: str, task_id: str} is required", "", {}
    if not isinstance(data["task_data"], dict):
        return "task_data: a JSON object (the task's row) is required", "", {}
    return None, session_id, data["task_data"]


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


async def read_body(receive: Any) -> bytes | None:
    """The whole body of a request (None when the client disconnected first)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay_body(body: bytes, receive: Any) -> Any:
    """A ``receive`` that hands the app ``body`` (already read), then the connection's own messages."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodyLimitMiddleware:
    """Refuse bodies over the limit with 413, before reading them whole.

    A declared ``Content-Length`` over the limit is refused at once; a chunked body is read
    up to the limit and refused as soon as it passes it. On ``jsonrpc_paths`` (``/mcp``) the
    refusal is a JSON-RPC error, the only error body an MCP client shows.
    """

    def __init__(self, app: Any, max_body_bytes: int, jsonrpc_paths: frozenset[str] = frozenset()):
        self.app = app
        self.max = max_body_bytes
        self.jsonrpc_paths = jsonrpc_paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _send_json(send, 400, {"error": "invalid Content-Length header"})
                    return
        if length is not None:
            if length > self.max:
                await _send_json(send, 413, self._too_large(scope))
                return
            await self.app(scope, receive, send)
            return
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max:
                await _send_json(send, 413, self._too_large(scope))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, replay_body(b"".join(chunks), receive), send)


    def _too_large(self, scope: dict) -> dict[str, Any]:
        message = f"body of {scope.get('method')} {scope.get('path')} exceeds the {self.max}-byte limit"
        if scope.get("path") in self.jsonrpc_paths:
            return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
        return {"error": message}


async def _send_json(send: Any, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
