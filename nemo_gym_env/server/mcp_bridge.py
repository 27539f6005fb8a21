"""Any MCP server as a resources server: its tools become ``POST /<tool>`` routes.

A config names the MCP server (a command on stdio, or a URL) and the reward; the server's
folder holds a two-line ``app.py``::

    # configs/clock.yaml
    clock:
      resources_servers:
        clock:
          entrypoint: app.py
          mcp_server:
            command: "{python}"                  # this interpreter
            args: [-m, mcp_server_time, --local-timezone, UTC]
          verify: verify.py:score                # score(row, trajectory) -> float | {"reward": ..., ...}

    # app.py
    from nemo_gym_env.server.mcp_bridge import McpResourcesServer

    if __name__ == "__main__":
        McpResourcesServer.run_webserver()

At start-up the server lists the MCP server's tools once (a probe connection) and adds one route
per tool, whose OpenAPI request body is the tool's input schema. Each resources session opens its
own MCP client session on ``/seed_session`` (for a stdio server: its own process, with its own
``{session_dir}``, a fresh temporary folder) and closes it after ``/verify``, on
``/close_session``, or when the session expires or is evicted. A tool call answers with the
tool's text (``text/plain``), or ``{"error": ...}`` the model can read: 400 for the tool's own
error result, 422 for arguments that are not a JSON object, 502 for an MCP error reply, 504 when
the MCP server does not answer within ``call_timeout_s``, and ``410 Gone`` when it exited, which
ends the episode (the env reports the reason in ``info["error"]``).

The reward: ``score(row, trajectory)``, a method a subclass overrides; by default the config's
``verify`` function (``file.py:function``, relative to the server's folder, or
``package.module:function``), else the config's ``verify_tool``: ``{"name": ..., "arguments":
{...}, "answer_argument": "answer"}`` (a bare name is ``{"name": name}``), called in the episode's
own MCP session before it closes; the reward is its structured ``reward``, or its text read as a
number. The reward is the server's, never the task row's: a row may give the verify tool its own
ground truth (``verify_tool: {"name": <the config's>, "arguments": {...}}``, merged over the
config's arguments), but a row that names another tool scores 0 with a ``verifier_error`` naming
the refusal, and that tool is never called.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import logging
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from mcp_types import CallToolResult, TextContent, Tool
from pydantic import BaseModel, ConfigDict, PrivateAttr
from starlette.concurrency import run_in_threadpool

from nemo_gym_env.errors import ConfigError, McpError
from nemo_gym_env.protocol.items import final_answer
from nemo_gym_env.protocol.types import (
    RESERVED_ROUTES,
    TOOL_NAME_RE,
    BaseSeedSessionRequest,
    BaseVerifyRequest,
)
from nemo_gym_env.server.base import BaseResourcesServerConfig, SimpleResourcesServer
from nemo_gym_env.server.mcp_upstream import McpConnection, McpServerSpec
from nemo_gym_env.server.middleware import add_lifespan
from nemo_gym_env.server.sessions import SessionStore

__all__ = ["McpResourcesServer", "McpResourcesServerConfig", "VerifyTool", "load_function", "result_text",
           "reward_of"]

logger = logging.getLogger("nemo_gym_env.server.mcp_bridge")

REAP_INTERVAL_S = 30.0
"""How often sessions that expired or were evicted have their MCP connections closed."""


class VerifyTool(BaseModel):
    """An MCP tool whose result is the reward: its name, its arguments, and which argument gets the answer."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] = {}
    answer_argument: str | None = None


class McpResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of :class:`McpResourcesServer` (see the module docstring).

    Attributes:
        mcp_server: The MCP server: ``command`` / ``args`` / ``env`` / ``cwd`` (stdio) or ``url`` /
            ``headers``; ``{python}`` and ``{session_dir}`` are expanded.
        verify: ``file.py:function`` or ``module:function``: ``(row, trajectory) -> float | mapping``
            (with ``reward`` and any metrics); may be ``async``.
        verify_tool: The MCP tool that scores an episode when the row names none.
        tools: Only these tools become routes (default: every tool the server lists).
        call_timeout_s: The longest one MCP request may take.
        start_timeout_s: The longest an MCP server may take to start (per session, and at start-up).
    """

    mcp_server: McpServerSpec
    verify: str | None = None
    verify_tool: VerifyTool | str | None = None
    tools: list[str] | None = None
    call_timeout_s: float = 60.0
    start_timeout_s: float = 60.0
    session_ttl_s: float = 900.0


def load_function(reference: str, base_dir: Path | None = None) -> Callable[..., Any]:
    """The function ``file.py:name`` (relative to ``base_dir``, default the current folder) or ``module:name``.

    Raises:
        ConfigError: the reference is malformed, or its file, module or function does not exist.
    """
    where, sep, name = reference.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(f"verify {reference!r}: write file.py:function or package.module:function")
    if where.endswith(".py"):
        path = (base_dir or Path.cwd()) / where if not Path(where).is_absolute() else Path(where)
        if not path.is_file():
            raise ConfigError(f"verify {reference!r}: no file {path}")
        spec = importlib.util.spec_from_file_location(f"_nemo_gym_env_verify_{abs(hash(str(path)))}", path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"verify {reference!r}: cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ConfigError(f"verify {reference!r}: cannot import {where}: {exc}") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError(f"verify {reference!r}: {where} has no function {name!r}")
    return function


def result_text(result: CallToolResult) -> str:
    """What the model reads of a tool result: its text blocks, else its structured content as JSON."""
    parts = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        else:  # images, audio, resources: say what came, never the bytes
            parts.append(f"[{block.type} content: {getattr(block, 'mime_type', None) or 'no type'}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


@dataclass
class _Upstream:
    connection: McpConnection
    session_dir: Path


class McpResourcesServer(SimpleResourcesServer):
    """A resources server whose tools are an MCP server's; see the module docstring.

    Subclasses may override :meth:`prepare_session` (fill the session's folder before the MCP
    server starts: the bundled ``git_history`` builds a repository there) and :meth:`score`.
    """

    config: McpResourcesServerConfig
    _tools: list[Tool] = PrivateAttr(default_factory=list)
    _upstreams: SessionStore[_Upstream] = PrivateAttr()
    _closing: set[asyncio.Task[None]] = PrivateAttr(default_factory=set)
    _verify_function: Callable[..., Any] | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        # The MCP connections are session state of their own: the same cap and idle TTL, and closed when dropped.
        self._upstreams = SessionStore(self.config.max_sessions, self.config.session_ttl_s,
                                       on_drop=self._schedule_close)

    # ---- start-up -----------------------------------------------------------------------------

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        if self.config.verify:
            self._verify_function = load_function(self.config.verify)
        self._tools = self._run_probe()
        wanted = set(self.config.tools) if self.config.tools is not None else None
        for tool in self._tools:
            if wanted is not None and tool.name not in wanted:
                continue
            if tool.name in RESERVED_ROUTES or not TOOL_NAME_RE.fullmatch(tool.name):
                raise ConfigError(f"{self.label}: the MCP tool {tool.name!r} cannot be a route (a reserved or "
                                  "invalid name); leave it out with `tools: [...]` in the config")
            app.post(f"/{tool.name}", summary=tool.title or tool.name, description=tool.description or "",
                     openapi_extra={"requestBody": {"required": True, "content": {
                         "application/json": {"schema": tool.input_schema}}}})(self._tool_route(tool.name))
        missing = sorted((wanted or set()) - {t.name for t in self._tools})
        if missing:
            raise ConfigError(f"{self.label}: `tools` names {missing}, which the MCP server does not list")
        add_lifespan(app, self._life)
        return app

    @property
    def label(self) -> str:
        """The server, for messages (an MCP server's own errors name it)."""
        return f"{type(self).__name__} ({self.config.name})"

    def _run_probe(self) -> list[Tool]:
        """The MCP server's tools, listed once by a connection of its own (in a thread: the app is not serving yet)."""
        found: list[Tool] = []
        failure: list[BaseException] = []

        async def probe() -> None:
            upstream = await self._open(None)
            try:
                found.extend(await upstream.connection.list_tools())
            finally:
                await self._close(upstream)

        def run() -> None:
            try:
                asyncio.run(probe())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                failure.append(exc)

        thread = threading.Thread(target=run, name="mcp-probe")
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        return found

    @contextlib.asynccontextmanager
    async def _life(self) -> AsyncIterator[None]:
        reaper = asyncio.create_task(self._reap_forever(), name="mcp-reaper")
        try:
            yield
        finally:
            reaper.cancel()
            upstreams = [u for u in (self._upstreams.pop(sid, None) for sid in list(self._upstreams)) if u]
            await asyncio.gather(*(self._close(u) for u in upstreams), *self._closing, return_exceptions=True)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(min(REAP_INTERVAL_S, self.config.session_ttl_s / 4))
            self.reap()

    def reap(self) -> int:
        """Close the MCP connections of sessions idle past the TTL (the store drops them, even when no
        request comes to do it); returns how many stay open."""
        return len(self._upstreams)

    # ---- sessions -----------------------------------------------------------------------------

    def prepare_session(self, row: dict[str, Any] | None, session_dir: Path) -> None:
        """Fill ``session_dir`` before the session's MCP server starts (``row`` is None for the start-up probe).

        Raise ``ValueError`` for a row that cannot be played: ``/seed_session`` answers 422 with the message.
        """

    async def _open(self, row: dict[str, Any] | None) -> _Upstream:
        session_dir = Path(tempfile.mkdtemp(prefix="nemo-gym-mcp-"))
        try:
            await run_in_threadpool(self.prepare_session, row, session_dir)
            spec = self.config.mcp_server.expand({"session_dir": str(session_dir)})
            connection = McpConnection(spec, call_timeout_s=self.config.call_timeout_s,
                                       start_timeout_s=self.config.start_timeout_s)
            await connection.open()
        except BaseException:
            shutil.rmtree(session_dir, ignore_errors=True)
            raise
        return _Upstream(connection, session_dir)

    @staticmethod
    async def _close(upstream: _Upstream) -> None:
        try:
            await upstream.connection.close()
        finally:
            await run_in_threadpool(shutil.rmtree, upstream.session_dir, True)

    def release_session(self, session_id: str) -> None:
        super().release_session(session_id)
        upstream = self._upstreams.pop(session_id, None)
        if upstream is not None:
            self._schedule_close(upstream)

    def _schedule_close(self, upstream: _Upstream) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (the app is not serving): nothing of it is running either
            return
        task = loop.create_task(self._close(upstream))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def seed_session(self, request: Request, body: BaseSeedSessionRequest) -> Any:
        """Open this session's own MCP client session (and server process, for stdio); 503 if it cannot start."""
        sid = self.session_id(request)
        self.release_session(sid)  # a second seed in the same session starts over
        row = body.model_dump()
        try:
            upstream = await self._open(row)
        except ValueError as exc:  # prepare_session: this row cannot be played
            return JSONResponse({"error": f"{self.label}: POST /seed_session: {exc}"}, status_code=422)
        except McpError as exc:
            return JSONResponse({"error": f"{self.label}: POST /seed_session: {exc}"}, status_code=503)
        self._upstreams[sid] = upstream
        return {}

    # ---- tools --------------------------------------------------------------------------------

    def _tool_route(self, name: str) -> Callable[[Request], Any]:
        async def call(request: Request) -> Response:
            return await self.call_tool(request, name)

        call.__name__ = f"mcp_tool_{name.replace('-', '_').replace('.', '_')}"
        return call

    async def call_tool(self, request: Request, name: str) -> Response:
        """``POST /<name>``: the arguments (a JSON object) to the session's MCP session; see the module docstring."""
        sid = self.session_id(request)
        upstream = self._upstreams.get(sid)
        where = f"{self.label}: POST /{name}"
        if upstream is None:
            return JSONResponse({"error": f"{where}: this episode has no MCP session: POST /seed_session first "
                                          "(it may also have been closed, verified or expired)"}, status_code=409)
        try:
            arguments = json.loads(await request.body() or b"{}")
        except (ValueError, RecursionError) as exc:
            return JSONResponse({"error": f"{where}: the arguments are not JSON: {exc}"}, status_code=422)
        if not isinstance(arguments, dict):
            return JSONResponse({"error": f"{where}: the arguments must be a JSON object, got "
                                          f"{type(arguments).__name__}"}, status_code=422)
        try:
            result = await upstream.connection.call_tool(name, arguments)
        except McpError as exc:
            if exc.gone:
                self.release_session(sid)
                return JSONResponse({"error": f"{where}: {exc}"}, status_code=410)
            status = 504 if exc.timed_out else 502
            return JSONResponse({"error": f"{where}: {exc}"}, status_code=status)
        text = result_text(result)
        if result.is_error:
            return JSONResponse({"error": text}, status_code=400)
        return PlainTextResponse(text)

    # ---- reward -------------------------------------------------------------------------------

    async def verify(self, request: Request, body: BaseVerifyRequest) -> Any:
        """Score the episode with :meth:`score`; echo the body back with ``reward`` and the metrics."""
        dumped = body.model_dump(mode="json")
        row = {k: v for k, v in dumped.items() if k != "response"}
        trajectory = dumped["response"]["output"]
        outcome = await self.score(row, trajectory, self.session_id(request))
        if isinstance(outcome, Mapping):
            if "reward" not in outcome:
                raise ValueError(f"the verify function returned {sorted(outcome)[:10]} without a 'reward'")
            return {**dumped, **outcome}
        return {**dumped, "reward": outcome}

    async def score(self, row: dict[str, Any], trajectory: list[dict[str, Any]],
                    session_id: str) -> float | Mapping[str, Any]:
        """The reward of an episode: the ``verify`` function, else the verify tool; see the module docstring."""
        if self._verify_function is not None:
            if inspect.iscoroutinefunction(self._verify_function):
                return await self._verify_function(row, trajectory)
            return await run_in_threadpool(self._verify_function, row, trajectory)
        named = self.config.verify_tool
        if named is None:
            raise ConfigError(f"{self.label} has no reward: set `verify` (a Python function) or `verify_tool` in "
                              "the config, or override score()")
        tool = VerifyTool(name=named) if isinstance(named, str) else VerifyTool.model_validate(named)
        tool = tool.model_copy(update={"arguments": {**tool.arguments, **self._row_verify_arguments(row, tool.name)}})
        upstream = self._upstreams.get(session_id)
        if upstream is None:
            raise McpError(f"{self.label}: the verify tool {tool.name!r} needs the episode's MCP session, "
                                 "which is closed", gone=True)
        arguments = dict(tool.arguments)
        if tool.answer_argument:
            arguments[tool.answer_argument] = final_answer(trajectory)
        result = await upstream.connection.call_tool(tool.name, arguments)
        if result.is_error:
            raise McpError(f"the verify tool {tool.name!r} failed: {result_text(result)[:500]}")
        return reward_of(result)


    def _row_verify_arguments(self, row: dict[str, Any], tool_name: str) -> dict[str, Any]:
        """The verify tool's arguments a row gives (its ground truth); a row may not choose the scoring tool."""
        named = row.get("verify_tool")
        if named is None:
            return {}
        name = named if isinstance(named, str) else named.get("name") if isinstance(named, Mapping) else None
        if name != tool_name:
            raise ValueError(f"the row names {str(name)[:100]!r} as its verify tool: a task row may not choose the "
                             f"scoring tool ({self.label} scores with its config's {tool_name!r})")
        arguments = named.get("arguments", {}) if isinstance(named, Mapping) else {}
        if not isinstance(arguments, Mapping):
            raise ValueError(f"the row's verify_tool arguments are {type(arguments).__name__}, not an object")
        return dict(arguments)


def reward_of(result: CallToolResult) -> float | dict[str, Any]:
    """The reward a verify tool gave: a ``reward`` key of its structured content (or of the JSON object
    its text holds, or of the SDK's ``{"result": ...}`` wrapping), else its text read as a number.

    Raises:
        ValueError: the result holds no reward.
    """
    text = result_text(result).strip()
    structured = result.structured_content
    candidates: list[Any] = [structured, structured.get("result") if isinstance(structured, Mapping) else None]
    try:
        candidates.append(json.loads(text))
    except (ValueError, RecursionError):
        pass
    for candidate in candidates:
        if isinstance(candidate, Mapping) and "reward" in candidate:
            return dict(candidate)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"the verify tool's result holds no reward: {text[:200]!r}") from None

