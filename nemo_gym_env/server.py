"""The resources server base class: NeMo Gym's ``SimpleResourcesServer`` API, hardened.

A server subclasses :class:`SimpleResourcesServer`, registers its tools in
``setup_webserver`` with ``app.post``, and implements ``verify``::

    class WeatherServer(SimpleResourcesServer):
        config: BaseResourcesServerConfig

        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()
            app.post("/get_weather")(self.get_weather)
            return app

        async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse: ...

        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            return BaseVerifyResponse(**body.model_dump(), reward=1.0)

    if __name__ == "__main__":
        WeatherServer.run_webserver()

What differs from NeMo Gym, on purpose and invisibly to clients: the session cookie is
signed with a per-launch random secret (NeMo Gym derives it from the class name, so anyone
can forge one), and a route that asks for the session id of a request whose cookie this
launch did not sign (forged, expired, or from before a restart) gets ``410 Gone`` rather than
a new, empty session that would be scored as if the episode had happened there; per-session state lives in a bounded :class:`SessionStore` freed after
``/verify``; a verifier that raises gives reward 0 with ``failure_reason`` instead of a 500;
bodies over ``max_body_bytes`` are refused with 413 before they are read whole; bad bodies
get a 4xx whose ``error`` names the route and the field.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import os
import secrets
import traceback
import uuid
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic_core import PydanticSerializationError
from starlette.middleware.sessions import SessionMiddleware

from .metrics import aggregate_metrics
from .sessions import SESSION_SECRET_ENV, SessionStore
from .types import (
    RESERVED_ROUTES,
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseRunRequest,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
)

__all__ = [
    "SESSION_ID_KEY",
    "SESSION_SECRET_ENV",
    "RESERVED_ROUTES",
    "BaseResourcesServerConfig",
    "SessionLostError",
    "SimpleResourcesServer",
    # Re-exported from .types so that a NeMo Gym server ports by renaming the modules it
    # imports from (``nemo_gym.base_resources_server`` and ``nemo_gym.server_utils`` both
    # become ``nemo_gym_env.server``); see docs/porting.md.
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseRunRequest",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
]

logger = logging.getLogger("nemo_gym_env.server")

SESSION_ID_KEY = "session_id"
"""Key of the session id inside the signed cookie, as in NeMo Gym."""


class BaseResourcesServerConfig(BaseModel):
    """Configuration of one server instance: NeMo Gym's keys plus our limits.

    Any other key in the server's YAML block is kept (``extra="allow"``) for subclasses.
    Validation errors never quote the input: it may hold API keys, and start-up errors end
    up in logs and in the launcher's error message.
    """

    model_config = ConfigDict(extra="allow", hide_input_in_errors=True)

    name: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    entrypoint: str = "app.py"
    domain: str | None = None
    description: str | None = None
    num_workers: int | None = None
    session_ttl_s: float = 3600.0
    max_sessions: int = 100_000
    max_body_bytes: int = 32 * 1024 * 1024


class SimpleResourcesServer(BaseModel):
    """Base class of every resources server; see the module docstring for an example.

    Subclasses add pydantic fields for their state (as in NeMo Gym) or keep per-session
    state in :attr:`sessions`, which is bounded and freed after ``/verify``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    config: BaseResourcesServerConfig = Field(default_factory=BaseResourcesServerConfig)
    server_client: Any = None
    _sessions: SessionStore[Any] = PrivateAttr()
    _secret: str = PrivateAttr()

    def model_post_init(self, __context: Any) -> None:
        self._sessions = SessionStore(max_sessions=self.config.max_sessions, ttl_s=self.config.session_ttl_s)
        self._secret = os.environ.get(SESSION_SECRET_ENV) or secrets.token_urlsafe(32)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None = None, name: str | None = None) -> "SimpleResourcesServer":
        """Build the server from its YAML block (a plain mapping), validated by its config class."""
        config_cls = cls.model_fields["config"].annotation
        if not (isinstance(config_cls, type) and issubclass(config_cls, BaseModel)):
            config_cls = BaseResourcesServerConfig
        values = dict(config or {})
        if name is not None:
            values["name"] = name
        values.setdefault("name", cls.__name__)
        return cls(config=config_cls.model_validate(values))

    @classmethod
    def run_webserver(cls) -> None:
        """Serve this server class as the launcher configured it (``python app.py``)."""
        from .launch import serve

        serve(cls)

    # ---- sessions -----------------------------------------------------------------------

    @property
    def sessions(self) -> SessionStore[Any]:
        """Per-session state keyed by session id; capped, expiring, freed after ``/verify``."""
        return self._sessions

    def session_cookie_name(self) -> str:
        """Cookie name, ``<ClassName>___<instance name>`` as in NeMo Gym."""
        return f"{type(self).__name__}___{self.config.name}"

    @staticmethod
    def session_id(request: Request) -> str:
        """The session id of a request (assigned on first contact).

        Raises:
            SessionLostError: the request carries a session cookie this launch did not sign
                (forged, expired, or issued before the server restarted): its state is gone.
                The route answers ``410 Gone``. ``request.session[SESSION_ID_KEY]``, as NeMo
                Gym servers write it, raises the same.
        """
        return request.session[SESSION_ID_KEY]

    def release_session(self, session_id: str) -> None:
        """Free a session's state; called after ``/verify``. Override to free your own structures."""
        self._sessions.pop(session_id, None)

    # ---- routes -------------------------------------------------------------------------

    def setup_webserver(self) -> FastAPI:
        """Create the app with the standard routes; subclasses call super() then add tools."""
        app = FastAPI(title=type(self).__name__, docs_url=None, redoc_url=None)
        self.setup_session_middleware(app)
        app.post("/seed_session")(self.seed_session)
        app.post("/verify")(_guard_verify(self.verify))
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        return app

    def setup_session_middleware(self, app: FastAPI) -> None:
        """Signed cookie sessions; every request gets a session id, ``/verify`` releases it."""
        app.add_middleware(_SessionIdMiddleware, server=self)
        app.add_middleware(
            SessionMiddleware,
            secret_key=self._secret,
            session_cookie=self.session_cookie_name(),
            max_age=int(self.config.session_ttl_s),
            same_site="lax",
        )

    def setup_liveness(self, app: FastAPI) -> None:
        """``GET /`` answers ``{"status": "ok"}``."""

        @app.get("/", include_in_schema=False)
        async def _liveness() -> dict[str, str]:
            return {"status": "ok"}

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Start an episode; the body is the whole dataset row. Override to set up state."""
        return BaseSeedSessionResponse()

    @abstractmethod
    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        """Score the finished episode in ``body.response``; echo ``body`` back with ``reward``."""

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """``mean/<metric>``, ``pass@k/reward`` and per-task metrics over verify replies."""
        return aggregate_metrics(body.verify_responses)

    def tool_names(self, app: FastAPI) -> list[str]:
        """Names of the tool routes registered on ``app`` (every POST route but the standard ones)."""
        names = []
        for route in app.routes:
            methods = getattr(route, "methods", None) or set()
            name = getattr(route, "path", "").lstrip("/")
            if "POST" in methods and name and "/" not in name and name not in RESERVED_ROUTES:
                names.append(name)
        return names

    def build_app(self) -> FastAPI:
        """The complete app: ``setup_webserver`` plus liveness, error handling and body limits."""
        app = self.setup_webserver()
        self.setup_liveness(app)
        _install_error_handlers(app, self)
        app.add_middleware(_BodyLimitMiddleware, max_body_bytes=self.config.max_body_bytes)
        return app


# ---- internals ------------------------------------------------------------------------------


def _guard_verify(verify: Any) -> Any:
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
            return _zero_reward(body, "verifier_error", f"{type(exc).__name__}: {exc}")
        reward = getattr(result, "reward", None) if not isinstance(result, Mapping) else result.get("reward")
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            return _zero_reward(body, "invalid_reward", f"verifier returned a non-finite reward: {reward!r}")
        return result

    # Resolve string annotations (``from __future__ import annotations`` in the server's
    # module) here, where the server's globals are known, so FastAPI sees real types.
    verify_route.__signature__ = inspect.signature(verify, eval_str=True)  # type: ignore[attr-defined]
    return verify_route


def _zero_reward(body: BaseVerifyRequest | None, kind: str, reason: str) -> JSONResponse:
    echoed = body.model_dump(mode="json") if body is not None else {}
    return JSONResponse({**echoed, "reward": 0.0, "failure_kind": kind, "failure_reason": reason})


def _install_error_handlers(app: FastAPI, server: SimpleResourcesServer) -> None:
    server_name = f"{type(server).__name__} ({server.config.name})"

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

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        logger.error("%s: POST %s raised: %s", server_name, request.url.path, traceback.format_exc())
        return JSONResponse(
            {"error": f"{server_name}: {request.url.path} failed: {type(exc).__name__}: {exc}"}, status_code=500
        )

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


class SessionLostError(Exception):
    """The request's session cookie was not signed by this launch of the server; answered 410."""

    def __str__(self) -> str:
        return ("the session cookie was not issued by this launch of the server (the server restarted, "
                "the session expired, or the cookie is forged): this session's state is gone. "
                "Start a new episode with POST /seed_session.")


class _LostSession(dict):
    """``request.session`` of a request whose cookie did not verify: asking for the id raises.

    It stays empty, so no new cookie is sent: every later request of that client meets the
    same 410 instead of silently landing in a fresh session.
    """

    accessed = False  # read by Starlette's SessionMiddleware (>= 1.0) when it answers
    modified = False

    def __getitem__(self, key: Any) -> Any:
        if key == SESSION_ID_KEY:
            raise SessionLostError(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key == SESSION_ID_KEY:
            raise SessionLostError(key)
        return super().get(key, default)


def _carries_cookie(scope: dict, name: str) -> bool:
    """Whether the request sent a cookie called ``name`` (whatever its value)."""
    wanted = name.encode("latin-1")
    for header, value in scope.get("headers", ()):
        if header == b"cookie" and any(part.split(b"=", 1)[0].strip() == wanted for part in value.split(b";")):
            return True
    return False


class _SessionIdMiddleware:
    """Pure ASGI: make sure the signed session holds an id; free it once ``/verify`` answered.

    A request without a session cookie, or any ``/seed_session``, gets a new id. A request whose
    cookie did not verify (SessionMiddleware left the session empty) gets a :class:`_LostSession`.
    """

    def __init__(self, app: Any, server: SimpleResourcesServer):
        self.app = app
        self.server = server
        self.cookie_name = server.session_cookie_name()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = scope.setdefault("session", {})
        session_id = session.get(SESSION_ID_KEY)
        if not isinstance(session_id, str):
            if scope.get("path") != "/seed_session" and _carries_cookie(scope, self.cookie_name):
                scope["session"] = _LostSession()
                await self.app(scope, receive, send)
                return
            session_id = str(uuid.uuid4())
            scope.setdefault("state", {})["new_session"] = True
        # Always assign, so the cookie is (re)sent on every reply, as NeMo Gym clients expect.
        session[SESSION_ID_KEY] = session_id
        try:
            await self.app(scope, receive, send)
        finally:
            if scope.get("path") == "/verify":
                self.server.release_session(session_id)


class _BodyLimitMiddleware:
    """Refuse bodies over the limit with 413, before reading them whole.

    A declared ``Content-Length`` over the limit is refused at once; a chunked body is read
    up to the limit and refused as soon as it passes it.
    """

    def __init__(self, app: Any, max_body_bytes: int):
        self.app = app
        self.max = max_body_bytes

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
                await _send_json(send, 413, _too_large(scope, self.max))
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
                await _send_json(send, 413, _too_large(scope, self.max))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _too_large(scope: dict, limit: int) -> dict[str, str]:
    return {"error": f"body of {scope.get('method')} {scope.get('path')} exceeds the {limit}-byte limit"}


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
