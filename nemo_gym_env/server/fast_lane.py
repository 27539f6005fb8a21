"""The fast lane: a resources server's plain JSON routes answered without FastAPI's general request path.

A tool call, a ``/verify`` or a ``/seed_session`` is one JSON body in, one JSON body out. FastAPI
serves it through about a dozen layers (its error and telemetry layers, each of the server's
middlewares, the router, dependency solving, the response class) that cost most of a server's CPU
per episode (``benchmarks/README.md``, "The fast lane"). :class:`ServerApp` is the FastAPI app of a
resources server; for a ``POST`` to a route the lane can take it does the same steps in one
function: the host check, the body limit, the session cookie, JSON and the body's model,
the endpoint, the reply's model, then the cookie on the reply.

The lane takes only what it answers exactly as FastAPI would, and hands everything else to the
full stack, the request body replayed:

- a route, when its endpoint is an ``async def`` taking one pydantic model as the whole body and
  optionally the ``Request`` and the ``Response``, with a pydantic model as its response model,
  no dependencies, no response options, FastAPI's own route class, and the first route that
  matches its path;
- an app, when its middlewares are the server's own (host check, body limit, catch-all, typed
  seed, session cookie) and nothing else (a server that adds one, or exposes MCP, gets no lane),
  with no ``root_path`` and FastAPI's native telemetry not configured when it serves its first
  request;
- a request, when it passes the host check, declares a ``Content-Length`` within the limit and
  the ``Content-Type`` ``application/json``, carries a session cookie that verifies (or
  none), is not NeMo Gym 0.7's typed seed, and its body validates.

A request that fails any of these meets the full stack, which refuses or answers it as it always
did (421, 413, 410, 422...). Once the endpoint has run, its errors are answered here by the app's
own exception handlers, or as the catch-all middleware would (500 naming the error).
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import ResponseValidationError
from fastapi.params import Body
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match

from nemo_gym_env.server.middleware import (
    BodyLimitMiddleware,
    CatchAllMiddleware,
    SessionCookieMiddleware,
    TypedSeedMiddleware,
    failed_reply,
    read_body,
    replay_body,
    typed_seed,
)
from nemo_gym_env.system.hosts import HostCheckMiddleware

__all__ = ["FastLane", "ServerApp"]

_UNBUILT = object()
_JSON_TYPES = (b"application/json",)
_SERVER_MIDDLEWARE = (HostCheckMiddleware, BodyLimitMiddleware, CatchAllMiddleware, TypedSeedMiddleware,
                      SessionCookieMiddleware)


class ServerApp(FastAPI):
    """A resources server's FastAPI app: FastAPI, with :class:`FastLane` in front of its plain JSON routes.

    Set ``app.fast_lane = False`` before its first request to serve every request through FastAPI.
    """

    fast_lane: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lane: Any = _UNBUILT

    def lane(self) -> FastLane | None:
        """The lane (built at the first request, when the routes and middlewares are final); None: no lane."""
        if self._lane is _UNBUILT:
            self._lane = FastLane.build(self) if self.fast_lane else None
        return self._lane

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            lane = self._lane if self._lane is not _UNBUILT else self.lane()
            route = lane.routes.get(scope["path"]) if lane is not None else None
            if route is not None and not scope.get("root_path"):
                await lane.serve(route, scope, receive, send, super().__call__)
                return
        await super().__call__(scope, receive, send)


@dataclass(frozen=True)
class LaneRoute:
    """A route the lane answers: its endpoint and how to call it."""

    route: APIRoute
    call: Callable[..., Any]
    body_name: str
    body_model: type[BaseModel]
    request_name: str | None
    response_name: str | None
    reply: TypeAdapter


class FastLane:
    """The server's middlewares' steps and its plain routes, in one function per request (see the module)."""

    def __init__(self, app: FastAPI, routes: dict[str, LaneRoute], middleware: dict[type, Any]):
        self.app = app
        self.routes = routes
        self.hosts: HostCheckMiddleware = middleware[HostCheckMiddleware]
        self.max_body: int = middleware[BodyLimitMiddleware].max
        self.server_name: str = middleware[CatchAllMiddleware].server_name
        self.sessions: SessionCookieMiddleware = middleware[SessionCookieMiddleware]
        self.answered = 0
        """Requests the lane answered (the others of its routes went to FastAPI's stack)."""

    @classmethod
    def build(cls, app: FastAPI) -> FastLane | None:
        """The lane of ``app``; None when the app has none (see the module docstring for when)."""
        middleware: dict[type, Any] = {}
        for entry in app.user_middleware:
            kind = entry.cls
            if kind not in _SERVER_MIDDLEWARE or kind in middleware:
                return None
            middleware[kind] = kind(None, *entry.args, **getattr(entry, "kwargs", {}))
        if set(_SERVER_MIDDLEWARE) - {TypedSeedMiddleware} - set(middleware) or app.root_path or _telemetry_on(app):
            return None
        routes = {}
        for route in app.router.routes:
            lane_route = _lane_route(route)
            if lane_route is not None and route.path != "/close_session" and _first_match(app, route.path) is route:
                routes[route.path] = lane_route
        return cls(app, routes, middleware) if routes else None

    async def serve(self, route: LaneRoute, scope: dict, receive: Any, send: Any, stack: Any) -> None:
        """Answer one ``POST`` to ``route``; what the lane does not take goes to ``stack`` (the full app)."""
        length = _json_length(scope)
        if length is None or length > self.max_body or self.hosts.refusal(scope) is not None:
            await stack(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client left
        opened = self.sessions.open(scope)
        value = _validated(route, body) if opened is not None else None
        if value is None:
            await stack(scope, replay_body(body, receive), send)
            return
        self.answered += 1
        session, session_id, started = opened
        scope["session"] = session
        scope["app"] = self.app
        scope["route"] = route.route
        scope["endpoint"] = route.route.endpoint
        scope["path_params"] = {}
        replay = replay_body(body, receive)
        try:
            await self._answer(route, value, scope, replay, send, session, started)
        finally:
            if route.route.path == "/verify":
                self.sessions.release_session(session_id)

    async def _answer(self, route: LaneRoute, value: BaseModel, scope: dict, receive: Any, send: Any,
                      session: dict, started: bool) -> None:
        kwargs: dict[str, Any] = {route.body_name: value}
        sub: Response | None = None
        if route.request_name is not None:
            kwargs[route.request_name] = Request(scope, receive)
        if route.response_name is not None:  # FastAPI's way: a Response whose headers and status the reply takes
            sub = kwargs[route.response_name] = Response()
            del sub.headers["content-length"]
            sub.status_code = None  # type: ignore[assignment]
        content = None
        try:
            result = await route.call(**kwargs)
            if isinstance(result, Response):
                reply: Response = result
            else:
                try:
                    content = route.reply.dump_json(route.reply.validate_python(result, from_attributes=True),
                                                    by_alias=True)
                except ValidationError as exc:  # FastAPI's error, less its pointer to the endpoint's source line
                    raise ResponseValidationError([{**error, "loc": ("response", *error["loc"])}
                                                   for error in exc.errors(include_url=False)], body=result) from exc
        except Exception as exc:  # noqa: BLE001 - answered as the app's handlers or the catch-all would
            handled = await self._handled(scope, receive, exc)
            if handled is None:  # the catch-all middleware, outside the session's: its 500 carries no cookie
                await failed_reply(self.server_name, scope.get("path", ""), exc)(scope, receive, send)
                return
            reply = handled
        if content is None:
            await reply(scope, receive, self.sessions.with_cookie(send, session, started))
            return
        status = sub.status_code if sub is not None and sub.status_code else 200
        headers = [(b"content-length", str(len(content)).encode("latin-1")), (b"content-type", b"application/json"),
                   *(sub.headers.raw if sub is not None else ())]
        await send({"type": "http.response.start", "status": status,
                    "headers": self.sessions.reply_headers(headers, session, started)})
        await send({"type": "http.response.body", "body": content})

    async def _handled(self, scope: dict, receive: Any, exc: Exception) -> Response | None:
        """The reply of the app's handler of ``exc``; None when it has none."""
        handlers = self.app.exception_handlers
        handler = handlers.get(exc.status_code) if isinstance(exc, HTTPException) else None
        # Handlers of Exception or 500 belong to the outermost layer, outside the catch-all: it answers first.
        handler = handler or next((handlers[kind] for kind in type(exc).__mro__
                                   if kind in handlers and kind is not Exception), None)
        if handler is None:
            return None
        reply = handler(Request(scope, receive), exc)
        reply = await reply if inspect.isawaitable(reply) else reply
        return reply if reply is not None else JSONResponse(None, status_code=500)


def _lane_route(route: Any) -> LaneRoute | None:
    """How the lane calls ``route``, or None when FastAPI's request path must serve it."""
    if type(route) is not APIRoute or route.methods != {"POST"} or getattr(route, "middleware", None):
        return None
    dependant = route.dependant
    if (route.dependencies or dependant.dependencies or dependant.path_params or dependant.query_params
            or dependant.header_params or dependant.cookie_params or len(dependant.body_params) != 1
            or getattr(dependant, "websocket_param_name", None) or getattr(dependant, "http_connection_param_name", None)
            or getattr(dependant, "background_tasks_param_name", None)
            or getattr(dependant, "security_scopes_param_name", None)):
        return None
    field = dependant.body_params[0]
    info = field.field_info
    model = _model_of(info.annotation)
    if (type(info) is not Body or getattr(info, "embed", False) or getattr(info, "media_type", None) != "application/json"
            or not (isinstance(model, type) and issubclass(model, BaseModel))):
        return None
    reply_model = route.response_model
    if (not (isinstance(reply_model, type) and issubclass(reply_model, BaseModel)) or route.status_code
            or getattr(route.response_class, "value", route.response_class) is not JSONResponse
            or route.response_model_include or route.response_model_exclude or not route.response_model_by_alias
            or route.response_model_exclude_unset or route.response_model_exclude_defaults
            or route.response_model_exclude_none):
        return None
    call = dependant.call
    if not inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call):
        return None
    return LaneRoute(route, call, field.name, model, dependant.request_param_name, dependant.response_param_name,
                     TypeAdapter(reply_model))


def _model_of(annotation: Any) -> Any:
    """The model of a body annotated ``Model`` or ``Model | None`` (the lane takes only non-empty bodies)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return models[0] if len(models) == 1 else None
    return annotation


def _first_match(app: FastAPI, path: str) -> Any:
    """The route FastAPI's router picks for a ``POST`` to ``path``."""
    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": []}
    return next((route for route in app.router.routes if route.matches(scope)[0] is Match.FULL), None)


def _telemetry_on(app: FastAPI) -> bool:
    """FastAPI's native telemetry (its recent releases) has somewhere to go: the lane would skip its spans."""
    telemetry = getattr(app, "_native_telemetry", None)
    return bool(telemetry is not None and telemetry.enabled())


def _json_length(scope: dict) -> int | None:
    """The declared ``Content-Length`` of a request whose ``Content-Type`` is plain JSON; else None.

    (Whether a body without a ``Content-Type`` is JSON depends on FastAPI's release: that one meets FastAPI.)
    """
    length = None
    json_type = False
    for key, value in scope["headers"]:
        if key == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif key == b"content-type":
            if json_type or value not in _JSON_TYPES:
                return None
            json_type = True
        elif key == b"transfer-encoding":
            return None
    return length if json_type else None


def _validated(route: LaneRoute, body: bytes) -> BaseModel | None:
    """The body as the route's model; None when FastAPI must answer it (not JSON, invalid, a typed seed)."""
    if not body or (route.route.path == "/seed_session" and typed_seed(body) is not None):
        return None
    try:
        return route.body_model.model_validate(json.loads(body), from_attributes=True)
    except (ValueError, RecursionError):  # JSONDecodeError and ValidationError are ValueErrors
        return None
