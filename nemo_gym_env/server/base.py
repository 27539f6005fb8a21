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

import math
import os
import secrets
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from nemo_gym_env.errors import ConfigError
from nemo_gym_env.system.hosts import HostCheckMiddleware, HostPolicy
from nemo_gym_env.protocol.keys import STEP_REWARD_HEADER
from nemo_gym_env.protocol.metrics import aggregate_metrics
from nemo_gym_env.protocol.types import (
    RELEASES_SESSION,
    RESERVED_ROUTES,
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
)
from nemo_gym_env.server.fast_lane import ServerApp
from nemo_gym_env.server.middleware import (
    SESSION_ID_KEY,
    BodyLimitMiddleware,
    CatchAllMiddleware,
    SessionCookieMiddleware,
    TypedSeedMiddleware,
    guard_verify,
    install_error_handlers,
)
from nemo_gym_env.server.serving import serve_server
from nemo_gym_env.server.sessions import SessionStore
from nemo_gym_env.system.child_env import SESSION_SECRET_ENV

__all__ = ["LIVENESS_ROUTES", "STEP_REWARD_HEADER", "BaseResourcesServerConfig", "CloseSessionRequest",
           "SimpleResourcesServer", "set_step_reward"]

LIVENESS_ROUTES = ("/", "/health", "/healthz", "/readyz", "/livez")
"""Where a server answers ``{"status": "ok"}`` (``GET /`` and NeMo Gym 0.7's health routes)."""


def set_step_reward(response: Response, value: float) -> None:
    """Give this tool call a step reward: the :data:`STEP_REWARD_HEADER` header of its reply.

    The body (what the model reads) is untouched, so the route behaves the same for clients that
    ignore step rewards, NeMo Gym's agent included. Take ``response: Response`` as a route
    parameter (FastAPI's way to set a header on a reply built from the return value)::

        async def lookup(self, body: LookupRequest, response: Response) -> LookupResponse:
            set_step_reward(response, 0.1)
            ...

    Raises:
        ValueError: ``value`` is not a finite number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"a step reward is a finite number, got {value!r}")
    response.headers[STEP_REWARD_HEADER] = repr(float(value))


class EpisodeId(BaseModel):
    """NeMo Gym 0.7's episode identity: a rollout id and the attempt."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    attempt: int = 0


class CloseSessionRequest(BaseModel):
    """Body of ``POST /close_session``: NeMo Gym 0.7's ids (echoed), or ``{}``; the cookie names the session."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str | None = None
    episode_id: EpisodeId | None = None


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
    http: Literal["auto", "httptools", "h11"] = "auto"
    """uvicorn's HTTP/1.1 parser: ``auto`` is httptools (a dependency of the package, about a fifth less server
    CPU a request than h11; ``benchmarks/README.md``) where it imports, else h11."""
    loop: Literal["asyncio", "uvloop", "auto"] = "asyncio"
    """The event loop. asyncio's own by default: uvloop served fewer episodes a second on this request path
    (``benchmarks/README.md``); ``uvloop`` (``pip install uvloop``) or ``auto`` (uvloop where installed) to choose it."""
    session_ttl_s: float = 3600.0
    max_sessions: int = 100_000
    max_body_bytes: int = 32 * 1024 * 1024
    expose_tools_over_mcp: bool = False
    """Serve the tools over MCP at ``/mcp`` too (NeMo Gym 0.7's key; needs the ``mcp`` extra). See docs/mcp.md."""
    mcp_tasks: str | None = None
    """A JSONL task list whose rows an MCP client names by index (``seed_session`` with ``task_index``)."""
    mcp_call_timeout_s: float = 60.0
    """The longest one MCP tool call (and its seed) may take."""
    mcp_session_idle_s: float = 600.0
    """How long an MCP handshake session may stay idle before it ends (and its episode); at ``max_sessions`` the
    least recently used idle one ends for a new client instead."""
    mcp_max_trajectory_bytes: int | None = None
    """The most an MCP episode's recorded tool arguments and outputs may hold; None: half of ``max_body_bytes``,
    so that its ``/verify`` body always fits. The call that would pass it is refused, naming the cap."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Names the server answers to besides its loopback names and the address it is bound to (``*``: any).
    A request naming another host gets 421, a state-changing one from a page of another site 403
    (``nemo_gym_env.system.hosts``; docs/security.md). A server bound to every interface with none answers to any."""


async def _verify_is_post_only() -> Response:
    return Response(status_code=405, headers={"allow": "POST", RELEASES_SESSION: "true"})


class SimpleResourcesServer(BaseModel):
    """Base class of every resources server; see the module docstring for an example.

    Besides the tools a subclass adds: ``/seed_session`` (the row, or NeMo Gym 0.7's typed
    body ``{resources_session_id, episode_id, task_id, task_data}``), ``/verify``,
    ``/aggregate_metrics``, ``/close_session`` (frees the cookie's session; idempotent),
    ``GET /reverify_mode`` (:attr:`REVERIFY_MODE`: ``"stateless"`` when ``/verify`` needs nothing
    but its body, so a stored rollout can be scored again) and the liveness routes.

    Subclasses add pydantic fields for their state (as in NeMo Gym) or keep per-session
    state in :attr:`sessions`, which is bounded and freed after ``/verify``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    REVERIFY_MODE: ClassVar[str] = "unknown"
    """``"stateless"``, ``"unsupported"`` or ``"unknown"`` (NeMo Gym 0.7's ``GET /reverify_mode``)."""

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
        serve_server(cls)

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
        app = ServerApp(title=type(self).__name__, docs_url=None, redoc_url=None)
        self.setup_session_middleware(app)
        app.add_middleware(TypedSeedMiddleware)
        app.post("/seed_session")(self.seed_session)
        # Marked so that clients know: the session's state is freed here, /close_session is not needed.
        app.post("/verify", openapi_extra={RELEASES_SESSION: True})(guard_verify(self.verify))
        # ...and say it to a GET, which is how an env asks before its first episode (envs/traits.py).
        app.get("/verify", include_in_schema=False)(_verify_is_post_only)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        app.post("/close_session")(self._close_session_route)
        app.get("/reverify_mode")(self._reverify_mode_route)
        return app

    async def _close_session_route(self, request: Request, body: CloseSessionRequest) -> dict[str, Any]:
        # The state is keyed by the session cookie; the body's ids are echoed (NeMo Gym 0.7's contract).
        self.release_session(self.session_id(request))
        return {"resources_session_id": body.resources_session_id} if body.resources_session_id else {}

    async def _reverify_mode_route(self) -> str:
        return type(self).REVERIFY_MODE

    def setup_session_middleware(self, app: FastAPI) -> None:
        """Signed cookie sessions; every request gets a session id, ``/verify`` releases it."""
        app.add_middleware(SessionCookieMiddleware, secret_key=self._secret, cookie_name=self.session_cookie_name(),
                           max_age=int(self.config.session_ttl_s), release_session=self.release_session)

    def setup_liveness(self, app: FastAPI) -> None:
        """``GET /`` (and NeMo Gym 0.7's ``/health``, ``/healthz``, ``/readyz``, ``/livez``) answer ``{"status": "ok"}``."""

        async def _liveness() -> dict[str, str]:
            return {"status": "ok"}

        for path in LIVENESS_ROUTES:
            app.get(path, include_in_schema=False)(_liveness)

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
        jsonrpc_paths: frozenset[str] = frozenset()
        if self.config.expose_tools_over_mcp:
            # Deferred on purpose: the MCP SDK is an extra, imported only by the servers that expose MCP.
            try:
                from nemo_gym_env.server.mcp_expose import expose_over_mcp
            except ModuleNotFoundError as exc:
                raise ConfigError(f"{type(self).__name__}: expose_tools_over_mcp needs the MCP SDK ({exc}): "
                                  "pip install 'nemo-gym-env[mcp]'") from exc
            jsonrpc_paths = expose_over_mcp(self, app).paths
        server_name = f"{type(self).__name__} ({self.config.name})"
        install_error_handlers(app, server_name)
        app.add_middleware(CatchAllMiddleware, server_name=server_name)
        app.add_middleware(BodyLimitMiddleware, max_body_bytes=self.config.max_body_bytes, jsonrpc_paths=jsonrpc_paths)
        app.add_middleware(HostCheckMiddleware, policy=self.host_policy(), label=server_name)  # outermost: first
        return app

    def host_policy(self) -> HostPolicy:
        """The names this server answers to (its bind address, loopback, ``allowed_hosts``)."""
        return HostPolicy(self.config.host, self.config.allowed_hosts)


