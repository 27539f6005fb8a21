"""A resources server's tools over MCP: the streamable-HTTP transport at ``/mcp`` on the server's own port.

On when the server's config says ``expose_tools_over_mcp: true`` (``nemo-gym-env serve NAME --mcp``
sets it, and ``mcp_tasks`` to the bundled server's example tasks). An MCP episode is one
resources-server session, played through the server's own routes (see
:mod:`~nemo_gym_env.server.mcp_episodes`), so its tool outputs and its reward are the env's.

How a client plays one episode:

1. ``seed_session`` (an MCP tool) with ``{"task_index": i}`` (a row of ``mcp_tasks``) or
   ``{"row": {...}}`` (a whole task row) starts the episode; its result holds the task's input
   messages and the episode's token. With the protocol's ``initialize`` handshake (MCP before
   2026-07-28) the MCP session is bound to the episode; the current protocol has no sessions, so
   its requests name the episode with the ``X-NeMo-Gym-Session-Token`` header.
   An HTTP ``POST /seed_session`` works too (NeMo Gym 0.7's way): its reply carries the token
   under ``"mcp"`` (``resources_tools`` for 0.7's typed seed body).
2. ``tools/list`` gives the task's tools as the env shows them to a model (the row's
   ``responses_create_params.tools``) plus ``verify``; before a task is chosen, every tool route
   with its request schema, plus ``seed_session``.
3. ``tools/call`` of a tool: the route's reply body is the result text (``isError`` for a 4xx/5xx
   reply, the step reward in ``_meta``), exactly the output the env would give.
4. ``verify`` with ``{"answer": "..."}`` ends the episode (the final assistant message) and
   returns the ``/verify`` reply (``reward`` and the metrics); ``close_session`` ends it unscored.

A Gymnasium-protocol server (``/reset``, ``/step``; a conversational server of
:mod:`nemo_gym_env.conversation`) is exposed too: ``seed_session`` resets (its result holds the first
observation, a conversation's opening request), each tool call is one ``/step``, and ``send_message``
(listed instead of ``verify``) is a turn that speaks (to the simulated user): its result is the next
observation, the step's reward and whether the episode ended, with the episode's info when it did.

Episodes are kept in a :class:`~nemo_gym_env.server.sessions.SessionStore` with the server's own
cap and idle TTL, so abandoned ones are reaped as the server's sessions are; an MCP session of the
handshake protocol that ends (``DELETE``, or the SDK's idle timeout) closes its episode. Handshake
sessions idle out after ``mcp_session_idle_s`` (10 minutes: an episode's length, not an hour),
and at the cap (``max_sessions``) a client opening a new one is served by ending the least
recently used idle one, not refused; only when every open session has a request in flight does a
new one get 503.
"""

from __future__ import annotations

import contextlib
import json
import types
import typing
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, INVALID_REQUEST, CallToolResult, ListToolsResult, TextContent, Tool
from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.routing import Route

from nemo_gym_env.errors import ConfigError, DatasetError
from nemo_gym_env.protocol.dataset import check_row, input_items, load_rows
from nemo_gym_env.protocol.types import RESERVED_ROUTES, TOOL_NAME_RE
from nemo_gym_env.server.mcp_episodes import (
    MCP_PATH,
    SESSION_TOKEN_HEADER,
    EpisodeRunner,
    McpEpisode,
    McpError,
)
from nemo_gym_env.server.mcp_seed import McpSeedMiddleware
from nemo_gym_env.server.middleware import add_lifespan
from nemo_gym_env.server.sessions import SessionStore

__all__ = ["HARNESS_META", "MCP_PATH", "SESSION_TOKEN_HEADER", "STEP_REWARD_META", "McpExposure", "expose_over_mcp"]

STEP_REWARD_META = "nemo_gym_env/step_reward"
"""Key of a tool call's step reward in its result's ``_meta``."""
HARNESS_META = "nemo_gym_env/harness"
"""Key set (true) in the ``_meta`` of the tools that are for harness code, not for a model: ``seed_session``
and ``close_session``. Every listing holds them (and ``verify``), so a client can validate any call it makes."""
_MCP_SESSION_HEADER = "mcp-session-id"

SEED_TOOL = Tool(
    name="seed_session", _meta={HARNESS_META: True},
    description="Start an episode: name a task by its index in this server's task list, or give the whole "
    "task row. Returns the task's input messages and the episode's token.",
    input_schema={"type": "object", "additionalProperties": False, "properties": {
        "task_index": {"type": "integer", "minimum": 0, "description": "a row of the server's task list"},
        "row": {"type": "object", "description": "a whole task row (responses_create_params and ground truth)"}}},
)
VERIFY_TOOL = Tool(
    name="verify",
    description="End the episode with your final answer and get its reward.",
    input_schema={"type": "object", "additionalProperties": False, "required": ["answer"],
                  "properties": {"answer": {"type": "string", "description": "your final answer"}}},
)
CLOSE_TOOL = Tool(
    name="close_session", _meta={HARNESS_META: True},
    description="End the episode unscored.",
    input_schema={"type": "object", "additionalProperties": False, "properties": {}},
)
CLOSE_TOOL_NAME = CLOSE_TOOL.name
SAY_TOOL = Tool(
    name="send_message",
    description="Say something to the user (a turn without a tool call). Returns the user's answer as `observation`, "
    "the step's reward, and whether the episode ended.",
    input_schema={"type": "object", "additionalProperties": False, "required": ["text"],
                  "properties": {"text": {"type": "string", "description": "what you say"}}},
)
"""A Gymnasium-protocol server's turn that is a message (listed instead of ``verify``)."""


def route_tools(app: FastAPI) -> list[Tool]:
    """Every tool route of ``app`` as an MCP tool, its input schema the route's request body schema."""
    tools = []
    for route in app.routes:
        if not isinstance(route, APIRoute) or "POST" not in route.methods:
            continue
        name = route.path.lstrip("/")
        if not name or "/" in name or "{" in name or name in RESERVED_ROUTES:
            continue
        extra = (route.openapi_extra or {}).get("requestBody", {}).get("content", {}).get("application/json", {})
        schema = extra.get("schema")
        if schema is None:
            bodies = route.dependant.body_params
            schema = _body_schema(bodies[0].field_info.annotation) if len(bodies) == 1 else None
        if not isinstance(schema, dict) or schema.get("type") != "object":
            schema = {"type": "object"}  # MCP wants an object schema; the route still checks the body
        tools.append(Tool(name=name, description=(route.description or route.summary or None), input_schema=schema))
    return tools


def _body_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a route's body annotation (``Model | None``: the model's, as the body may be omitted)."""
    members = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(members) == 1:
        annotation = members[0]
    return TypeAdapter(annotation).json_schema()


def row_tools(row: dict[str, Any]) -> list[Tool]:
    """The row's function tools (what the env shows a model) as MCP tools."""
    tools = []
    for spec in row.get("responses_create_params", {}).get("tools") or []:
        if not isinstance(spec, dict) or spec.get("type", "function") != "function" or not spec.get("name"):
            continue
        schema = spec.get("parameters")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            schema = {"type": "object"}
        tools.append(Tool(name=spec["name"], description=spec.get("description"), input_schema=schema))
    return tools


def _fault(message: str, code: int = INVALID_REQUEST) -> MCPError:
    return MCPError(code=code, message=message)


def _result(payload: dict[str, Any], *, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(payload, ensure_ascii=False))],
                          structured_content=payload, is_error=error)


class McpExposure:
    """The ``/mcp`` endpoint of one server; see the module docstring."""

    def __init__(self, server: Any, app: FastAPI, *, gymnasium: bool = False):
        config = server.config
        self.gymnasium = gymnasium
        self.server = server
        self.label = f"{type(server).__name__} ({config.name})"
        self.app = app
        self.tasks = self._load_tasks(config)
        self.episodes: SessionStore[McpEpisode] = SessionStore(config.max_sessions, config.session_ttl_s)
        self.bound: SessionStore[str] = SessionStore(config.max_sessions, config.session_ttl_s)
        self.runner = EpisodeRunner(app, self.label, call_timeout_s=config.mcp_call_timeout_s,
                                    max_trajectory_bytes=config.mcp_max_trajectory_bytes or config.max_body_bytes // 2,
                                    gymnasium=gymnasium)
        self._route_tools: list[Tool] | None = None
        self.mcp = Server(config.name or type(server).__name__, on_list_tools=self.list_tools,
                          on_call_tool=self.call_tool)
        # The server's own Host and Origin check runs first (build_app); the SDK's says the same names again.
        policy = server.host_policy()
        security = TransportSecuritySettings(enable_dns_rebinding_protection=not policy.any_host,
                                             allowed_hosts=policy.host_patterns(),
                                             allowed_origins=policy.origin_patterns())
        common = {"json_response": True, "security_settings": security,
                  "max_request_body_size": config.max_body_bytes}
        self.max_mcp_sessions = config.max_sessions
        self.sessions = StreamableHTTPSessionManager(
            self.mcp, session_idle_timeout=min(config.session_ttl_s, config.mcp_session_idle_s),
            max_sessions=config.max_sessions, **common)
        self._opened: OrderedDict[str, int] = OrderedDict()  # handshake session id -> requests in flight, LRU first
        self.stateless = StreamableHTTPSessionManager(self.mcp, stateless=True, **common)

    def _load_tasks(self, config: Any) -> list[dict[str, Any]] | None:
        if not config.mcp_tasks:
            return None
        path = Path(config.mcp_tasks).expanduser()
        try:
            return load_rows(path)
        except (OSError, DatasetError) as exc:
            raise ConfigError(f"{self.label}: mcp_tasks {str(path)!r} cannot be read: {exc}") from exc

    # ---- wiring -------------------------------------------------------------------------------

    paths = frozenset({MCP_PATH, MCP_PATH + "/"})
    """Where the endpoint answers."""

    def install(self) -> None:
        """Mount ``/mcp``, add the seed metadata, and run the SDK's session managers with the app."""
        for path in sorted(self.paths):
            self.app.router.routes.insert(0, Route(path, _Endpoint(self), methods=["GET", "POST", "DELETE"],
                                                   include_in_schema=False))
        self.app.add_middleware(McpSeedMiddleware, exposure=self)
        add_lifespan(self.app, self._life)

    @contextlib.asynccontextmanager
    async def _life(self) -> AsyncIterator[None]:
        async with self.sessions.run(), self.stateless.run():
            try:
                yield
            finally:
                for token in list(self.episodes):
                    episode = self.episodes.pop(token, None)
                    if episode is not None:
                        await episode.client.aclose()

    async def handle(self, scope: dict, receive: Any, send: Any) -> None:
        """One HTTP request to ``/mcp``: a request naming its episode by header needs no MCP session."""
        headers = Request(scope).headers
        if _MCP_SESSION_HEADER not in headers and SESSION_TOKEN_HEADER in headers:
            await self.stateless.handle_request(scope, receive, send)
            return
        mcp_session = headers.get(_MCP_SESSION_HEADER)
        if mcp_session is None:
            if scope.get("method") == "POST":
                await self._make_room(scope)
            await self.sessions.handle_request(scope, receive, self._noting_opened(send))
            return
        opened = mcp_session in self._opened
        if opened:
            self._opened[mcp_session] += 1
            self._opened.move_to_end(mcp_session)
        try:
            await self.sessions.handle_request(scope, receive, send)
        finally:
            if opened and mcp_session in self._opened:
                self._opened[mcp_session] -= 1
        if scope.get("method") == "DELETE":
            self._opened.pop(mcp_session, None)
            await self._end_binding(mcp_session)

    def _noting_opened(self, send: Any) -> Any:
        """``send``, remembering the session id the SDK hands a new session."""
        async def noting(message: dict) -> None:
            if message.get("type") == "http.response.start":
                for key, value in message.get("headers", ()):
                    if key.lower() == _MCP_SESSION_HEADER.encode():
                        self._opened[value.decode("latin-1")] = 0
            await send(message)

        return noting

    async def _make_room(self, scope: dict) -> None:
        """At the cap, end the least recently used idle handshake sessions (the SDK would refuse with 503)."""
        while len(self._opened) >= self.max_mcp_sessions:
            idle = next((sid for sid, busy in self._opened.items() if busy == 0), None)
            if idle is None:
                return  # every session has a request in flight: the SDK's 503 stands
            await self._end_session(idle, scope)

    async def _end_session(self, mcp_session: str, scope: dict) -> None:
        """End a handshake session as its client's ``DELETE`` would (the SDK's own path), and its episode."""
        self._opened.pop(mcp_session, None)
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() in (b"host", b"origin")]
        delete = {**scope, "method": "DELETE", "headers": [*headers, (_MCP_SESSION_HEADER.encode(), mcp_session.encode())],
                  "query_string": b""}

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(message: dict) -> None:
            return None

        await self.sessions.handle_request(delete, receive, discard)
        await self._end_binding(mcp_session)

    async def _end_binding(self, mcp_session: str) -> None:
        token = self.bound.pop(mcp_session, None)
        episode = self.episodes.pop(token, None) if token is not None else None
        if episode is not None:
            await self.runner.close(episode)

    # ---- episodes -----------------------------------------------------------------------------

    def add_episode(self, episode: McpEpisode) -> None:
        """Keep ``episode`` under its token (also for episodes seeded over HTTP)."""
        self.episodes[episode.token] = episode

    def _episode(self, request: Request | None, *, required: bool) -> McpEpisode | None:
        headers = request.headers if request is not None else {}
        token = headers.get(SESSION_TOKEN_HEADER)
        if token:
            episode = self.episodes.get(token)
            if episode is None and required:
                raise _fault(f"{self.label}: the {SESSION_TOKEN_HEADER} header names no live episode (unknown, "
                             "verified, closed or expired): start one with seed_session")
            return episode
        mcp_session = headers.get(_MCP_SESSION_HEADER)
        bound = self.bound.get(mcp_session) if mcp_session else None
        episode = self.episodes.get(bound) if bound else None
        if episode is None and required:
            raise _fault(f"{self.label}: no episode: call seed_session first (with task_index or row), or send "
                         f"the {SESSION_TOKEN_HEADER} header of an episode")
        return episode

    # ---- the MCP handlers ---------------------------------------------------------------------

    async def list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        """The episode's tools and ``verify`` (before one starts, the server's tools and ``verify``), then the
        harness's ``seed_session`` and ``close_session``: every tool a call may name is always listed, so a
        client can validate each call's result whatever the episode's state when it refreshes its list."""
        episode = self._episode(ctx.request, required=False)
        if self.gymnasium:
            tools = row_tools(episode.row) if episode is not None else []
            return ListToolsResult(tools=[*tools, SAY_TOOL, SEED_TOOL, CLOSE_TOOL])
        if episode is not None:
            tools = row_tools(episode.row)
        else:
            if self._route_tools is None:
                self._route_tools = route_tools(self.app)
            tools = self._route_tools
        return ListToolsResult(tools=[*tools, VERIFY_TOOL, SEED_TOOL, CLOSE_TOOL])

    async def call_tool(self, ctx: Any, params: Any) -> CallToolResult:
        """A tool of the episode, or one of ``seed_session``, ``verify``, ``close_session``."""
        name, arguments = params.name, dict(params.arguments or {})
        if name == SEED_TOOL.name:
            return await self._seed(ctx.request, arguments)
        episode = self._episode(ctx.request, required=True)
        assert episode is not None
        if self.gymnasium and name in (VERIFY_TOOL.name, SAY_TOOL.name):
            return await self._say(ctx.request, episode, arguments, name)
        if name == VERIFY_TOOL.name:
            return await self._verify(ctx.request, episode, arguments)
        if name == CLOSE_TOOL_NAME:
            self._forget(ctx.request, episode)
            await self.runner.close(episode)
            return _result({"closed": True})
        if name in RESERVED_ROUTES or not TOOL_NAME_RE.fullmatch(name):  # "verify?x", "../verify": never a route
            raise _fault(f"{self.label}: {name[:100]!r} is not a tool", INVALID_PARAMS)
        try:
            reply = await self.runner.call(episode, name, arguments)
        except McpError as exc:
            await self._end_if_over(ctx.request, episode)  # a Gymnasium-protocol server failed the step
            return CallToolResult(content=[TextContent(type="text", text=json.dumps({"error": str(exc)}))],
                                  is_error=True)
        meta = {STEP_REWARD_META: reply.step_reward} if reply.step_reward is not None else None
        await self._end_if_over(ctx.request, episode)  # a Gymnasium-protocol server ended it at this call
        return CallToolResult(content=[TextContent(type="text", text=reply.text)], is_error=reply.status >= 400,
                              _meta=meta)

    async def _seed(self, request: Request | None, arguments: dict[str, Any]) -> CallToolResult:
        mcp_session = request.headers.get(_MCP_SESSION_HEADER) if request is not None else None
        has_token = request is not None and SESSION_TOKEN_HEADER in request.headers
        if mcp_session and not has_token and self._episode(request, required=False) is not None:
            raise _fault(f"{self.label}: this MCP session already plays an episode: end it with verify or "
                         "close_session, or open another session")
        row, index = self._task_of(arguments)
        try:
            episode = await self.runner.seed(row, index)
        except McpError as exc:
            raise _fault(str(exc)) from None
        self.add_episode(episode)
        if mcp_session and not has_token:
            self.bound[mcp_session] = episode.token
        result = {"task_index": index, "input": input_items(row), "tools": [t.name for t in row_tools(row)],
                  "session_token": episode.token, "headers": {SESSION_TOKEN_HEADER: episode.token}}
        if self.gymnasium:
            result.update(observation=episode.observation, tools=[*result["tools"], SAY_TOOL.name])
        return _result(result)

    def _task_of(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        unknown = sorted(set(arguments) - {"task_index", "row"})
        if unknown or ("row" in arguments) == ("task_index" in arguments):
            raise _fault(f"{self.label}: seed_session takes exactly one of task_index or row"
                         + (f" (unknown: {unknown[:5]})" if unknown else ""), INVALID_PARAMS)
        if "row" in arguments:
            row = arguments["row"]
            problem = check_row(row)
            if problem is not None:
                raise _fault(f"{self.label}: seed_session: the row is not a task row: {problem}", INVALID_PARAMS)
            index = row.get("_ng_task_index") if isinstance(row.get("_ng_task_index"), int) else None
            return row, index
        index = arguments["task_index"]
        if self.tasks is None:
            raise _fault(f"{self.label}: this server has no task list (mcp_tasks): give the row instead, or serve "
                         "it with `nemo-gym-env serve NAME --mcp` (the bundled example tasks)", INVALID_PARAMS)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.tasks):
            raise _fault(f"{self.label}: task_index must be an integer in [0, {len(self.tasks)}), got {index!r}",
                         INVALID_PARAMS)
        return self.tasks[index], index

    async def _verify(self, request: Request | None, episode: McpEpisode, arguments: dict[str, Any]) -> CallToolResult:
        answer = arguments.get("answer", "")
        if not isinstance(answer, str) or set(arguments) - {"answer"}:
            raise _fault(f"{self.label}: verify takes {{\"answer\": string}}", INVALID_PARAMS)
        # An answer has a cap of its own (a quarter of the trajectory's), so a full trajectory still scores.
        cap = self.runner.max_trajectory_bytes // 4
        if len(answer.encode()) > cap:
            raise _fault(f"{self.label}: the answer ({len(answer.encode()):,} bytes) passes the cap on an answer "
                         f"({cap:,} bytes, a quarter of the episode's trajectory cap): send a shorter one",
                         INVALID_PARAMS)
        self._forget(request, episode)
        try:
            verdict = await self.runner.verify(episode, answer)
        except McpError as exc:
            return _result({"error": str(exc)}, error=True)
        finally:
            await self.runner.close(episode, release=False)  # /verify freed the server's session
        shown = {k: v for k, v in verdict.items() if k not in ("response", "responses_create_params")}
        if episode.step_rewards:
            shown["step_rewards"] = episode.step_rewards
        return _result(shown)

    async def _say(self, request: Request | None, episode: McpEpisode, arguments: dict[str, Any],
                   name: str) -> CallToolResult:
        if name == VERIFY_TOOL.name:
            raise _fault(f"{self.label}: a Gymnasium-protocol server rewards each step and has no verify: speak "
                         "with send_message; the episode ends when the server ends it", INVALID_PARAMS)
        text = arguments.get("text")
        if not isinstance(text, str) or set(arguments) - {"text"}:
            raise _fault(f"{self.label}: send_message takes {{\"text\": string}}", INVALID_PARAMS)
        try:
            step = await self.runner.say(episode, text)
        except McpError as exc:
            await self._end_if_over(request, episode)  # the server failed the step (its user model, say)
            return _result({"error": str(exc)}, error=True)
        shown = {key: step.get(key) for key in ("observation", "reward", "terminated", "truncated")}
        if episode.ended:
            shown.update(info=step.get("info") or {}, step_rewards=episode.step_rewards)
        await self._end_if_over(request, episode)
        return _result(shown)

    async def _end_if_over(self, request: Request | None, episode: McpEpisode) -> None:
        """Forget and close a Gymnasium-protocol episode its server ended (or failed): it cannot go on."""
        if episode.ended:
            self._forget(request, episode)
            await self.runner.close(episode, release=False)

    def _forget(self, request: Request | None, episode: McpEpisode) -> None:
        self.episodes.pop(episode.token, None)
        mcp_session = request.headers.get(_MCP_SESSION_HEADER) if request is not None else None
        if mcp_session and self.bound.get(mcp_session) == episode.token:
            self.bound.pop(mcp_session, None)


class _Endpoint:
    """The ASGI app at ``/mcp`` (a class, so Starlette hands it the raw request)."""

    def __init__(self, exposure: McpExposure):
        self.exposure = exposure

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.exposure.handle(scope, receive, send)


def expose_over_mcp(server: Any, app: FastAPI) -> McpExposure:
    """Serve ``server``'s tools at ``/mcp`` on ``app`` (called by ``build_app`` when the config asks).

    Raises:
        ConfigError: the server speaks neither the tools protocol (``/seed_session``, tools, ``/verify``) nor the
            Gymnasium protocol (``/reset``, ``/step``).
    """
    posts = {route.path for route in app.routes if isinstance(route, APIRoute) and "POST" in route.methods}
    gymnasium = {"/reset", "/step"} <= posts and "/verify" not in posts
    if not gymnasium and not {"/seed_session", "/verify"} <= posts:
        raise ConfigError(f"{type(server).__name__} ({server.config.name}): expose_tools_over_mcp serves the tools "
                          "protocol (/seed_session, tools, /verify) or the Gymnasium protocol (/reset, /step), and "
                          "this server speaks neither; serve it without --mcp")
    exposure = McpExposure(server, app, gymnasium=gymnasium)
    exposure.install()
    return exposure
