"""One connection from a resources server to an MCP server: a command on stdio or a URL.

:class:`~nemo_gym_env.server.mcp_bridge.McpResourcesServer` opens one :class:`McpConnection` per
resources session (on ``/seed_session``) and closes it with the session. The connection lives in
a task of its own, because the MCP SDK's client must be entered and left in the same task while
the routes that use it run in the tasks of their requests. Every call is bounded: the start by
``start_timeout_s``, each request by ``call_timeout_s``, the close by :data:`CLOSE_TIMEOUT_S`.

What can go wrong, and what the caller sees (always :class:`~nemo_gym_env.errors.McpError`):

- the server does not start, or does not finish the MCP handshake in time: ``gone=True``, with
  the last lines it wrote to stderr;
- a request is not answered in time (the server hangs): ``gone=False``; later calls may work;
- the server exits or closes the connection: ``gone=True``, with its last stderr lines;
- the server answers a request with an MCP error (an unknown tool, bad arguments): ``gone=False``.

A server that writes text that is not JSON-RPC to stdout does not disturb the SDK's client: the
lines are skipped, and a request they were meant to answer times out. A reply of the wrong shape
fails its own call (``gone=False``).

A stdio server runs in a process group of its own (the SDK starts it in a new session; a shell
line that ``exec``s it first tells this side its process id on stderr). Its whole group is killed
when the connection closes (``/close_session``, idle reaping, the resources server's shutdown),
so a child it started (a tool that runs ``sleep 600``) does not outlive it; and a watcher notices
the server's own exit even while such a child still holds its pipes (the SDK would wait for the
pipes to close, and every call would time out): the connection is then gone, and the group
killed.

Example::

    connection = McpConnection(McpServerSpec(command="{python}", args=["-m", "mcp_server_time"]),
                               call_timeout_s=30, start_timeout_s=60)
    await connection.open()
    result = await connection.call_tool("get_current_time", {"timezone": "UTC"})
    await connection.close()
"""

from __future__ import annotations

import asyncio
import collections
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Mapping
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, CallToolResult, Tool
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nemo_gym_env.errors import McpError

__all__ = ["CLOSE_TIMEOUT_S", "STDERR_TAIL_BYTES", "McpConnection", "McpServerSpec"]

CLOSE_TIMEOUT_S = 10.0
"""How long closing a connection may take before its task is cancelled (the SDK then kills the process)."""

STDERR_TAIL_BYTES = 4096
"""How much of a stdio server's stderr is kept, to say why it failed."""

WATCH_INTERVAL_S = 0.25
"""How often the watcher checks that a stdio server's own process is still alive."""

_PID_MARKER = "NEMO-GYM-ENV-MCP-PID"
_LAUNCH = f'printf "{_PID_MARKER} %s\\n" "$$" >&2; exec "$0" "$@"'
"""A POSIX shell line that says its process id on stderr, then becomes the server (same process, same group)."""


class McpServerSpec(BaseModel):
    """Where an MCP server is: ``command`` (+ ``args``, ``env``, ``cwd``) for stdio, or ``url``.

    Strings may hold placeholders: ``{python}`` (this Python interpreter, so a server installed
    in the same environment starts without being on ``PATH``) and whatever else the caller
    expands (``{session_dir}`` in :class:`~nemo_gym_env.server.mcp_bridge.McpResourcesServer`).
    ``env`` is added to the SDK's minimal default environment (PATH, HOME, ...), never to this
    process's own, so no secret of the resources server reaches the MCP server.
    ``mode`` is the SDK client's connect mode: ``"auto"`` (the protocol's current, per-request
    form where the server speaks it, else the ``initialize`` handshake) or ``"legacy"``.
    """

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    mode: str = "auto"

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server is either a 'command' (stdio) or a 'url' (streamable HTTP): give one")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"'url' must start with http:// or https://, got {self.url[:80]!r}")
        if self.mode not in ("auto", "legacy"):
            raise ValueError(f"'mode' is 'auto' or 'legacy', got {self.mode!r}")
        return self

    def expand(self, values: Mapping[str, str]) -> McpServerSpec:
        """A copy with ``{python}`` and each ``{key}`` of ``values`` replaced in every string."""
        table = {"python": sys.executable, **values}

        def sub(text: str) -> str:
            for key, value in table.items():
                text = text.replace("{" + key + "}", value)
            return text

        return self.model_copy(update={
            "command": sub(self.command) if self.command is not None else None,
            "args": [sub(a) for a in self.args],
            "env": {k: sub(v) for k, v in self.env.items()} if self.env is not None else None,
            "cwd": sub(self.cwd) if self.cwd is not None else None,
            "url": sub(self.url) if self.url is not None else None,
        })

    def describe(self) -> str:
        """The server in a few words for messages (no environment values or headers: they may be secrets)."""
        if self.url is not None:
            return f"MCP server at {self.url.split('?')[0]}"
        shown = " ".join(shlex.quote(part) for part in [os.path.basename(self.command or ""), *self.args[:2]])
        return f"MCP server `{shown}{' ...' if len(self.args) > 2 else ''}`"


class _Tail(asyncio.Protocol):
    """Keeps the last :data:`STDERR_TAIL_BYTES` a stdio server wrote to stderr."""

    def __init__(self) -> None:
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.closed = asyncio.Event()
        self.pid: int | None = None
        self._head = b""  # stderr before its first line ends: where the launch line says the process id

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def data_received(self, data: bytes) -> None:
        if self._head is not None:
            self._head += data
            line, newline, rest = self._head.partition(b"\n")
            if not newline and len(self._head) < 256:
                return
            self._head = None  # type: ignore[assignment]
            words = line.decode("ascii", "replace").split()
            if len(words) == 2 and words[0] == _PID_MARKER and words[1].isdigit():
                self.pid, data = int(words[1]), rest
            else:
                data = line + newline + rest
            if not data:
                return
        self.chunks.append(data)
        self.size += len(data)
        while self.size > STDERR_TAIL_BYTES and len(self.chunks) > 1:
            self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        return b"".join(self.chunks)[-STDERR_TAIL_BYTES:].decode("utf-8", "replace").strip()


def _describe_failure(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups (anyio's task groups raise them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text


class McpConnection:
    """One MCP client session with one MCP server; see the module docstring.

    Args:
        spec: The server (placeholders already expanded, but for ``{python}``).
        call_timeout_s: The longest a request (a tool call, the tool list) may take.
        start_timeout_s: The longest the start (spawn and handshake) may take.
    """

    def __init__(self, spec: McpServerSpec, *, call_timeout_s: float = 60.0, start_timeout_s: float = 60.0):
        self.spec = spec.expand({})
        self.label = self.spec.describe()
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._failure: str | None = None
        self._gone: str | None = None
        self._tail: _Tail | None = None
        self._tail_transport: asyncio.ReadTransport | None = None
        self._watcher: asyncio.Task[None] | None = None

    # ---- life ---------------------------------------------------------------------------------

    async def open(self) -> None:
        """Start the server (stdio) or connect (URL) and finish the MCP handshake.

        Raises:
            McpError: it did not start within ``start_timeout_s``, or failed to (``gone=True``).
        """
        errlog = None
        if self.spec.command is not None:
            missing = _missing_command(self.spec)
            if missing:
                self._gone = missing
                raise McpError(f"{self.label} could not start: {missing}", gone=True)
            read_fd, write_fd = os.pipe()
            self._tail = _Tail()
            self._tail_transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: self._tail, os.fdopen(read_fd, "rb", buffering=0))
            errlog = os.fdopen(write_fd, "w")
        self._task = asyncio.create_task(self._own(errlog), name=f"mcp-connection {self.label}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.start_timeout_s)
        except TimeoutError:
            await self.close()
            raise McpError(self._with_stderr(f"{self.label} did not start within {self.start_timeout_s:g} s"),
                                 gone=True) from None
        finally:
            if errlog is not None:
                errlog.close()  # the child holds its own copy; stderr reaches EOF when it exits
        if self._client is None:
            await self._stderr_done()
            await self.close()
            raise McpError(self._with_stderr(f"{self.label} could not start: {self._failure}"), gone=True)
        if self.pid is not None:
            self._watcher = asyncio.create_task(self._watch(), name=f"mcp-watch {self.label}")

    @property
    def pid(self) -> int | None:
        """The stdio server's process id (its process group's too), once it said it; None for a URL."""
        return self._tail.pid if self._tail is not None else None

    async def _watch(self) -> None:
        """Notice the server's own exit, even while a child of it holds its pipes; then end its group."""
        pid = self.pid
        assert pid is not None
        while self._client is not None:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if not _process_alive(pid):
                self._mark_gone("it exited")
                self._end_group()
                return

    def _end_group(self) -> None:
        """Kill what is left of the server's process group, once (its id is not used again after)."""
        if self._tail is not None and self._tail.pid is not None:
            _kill_group(self._tail.pid)
            self._tail.pid = None

    async def _own(self, errlog: Any) -> None:
        try:
            async with Client(self._transport(errlog), read_timeout_seconds=self.call_timeout_s,
                              mode=self.spec.mode) as client:
                self._client = client
                self._ready.set()
                await self._stop.wait()
        except asyncio.CancelledError:
            self._failure = self._failure or "cancelled"
            raise
        except BaseException as exc:  # noqa: BLE001 - whatever ended the connection is the reason it is gone
            self._failure = _describe_failure(exc)
        finally:
            self._client = None
            self._gone = self._gone or self._failure or "closed"
            self._ready.set()

    def _transport(self, errlog: Any) -> Any:
        if self.spec.url is not None:
            http = httpx2.AsyncClient(headers=self.spec.headers,
                                      timeout=httpx2.Timeout(self.call_timeout_s, connect=self.start_timeout_s))
            return streamable_http_client(self.spec.url, http_client=http)
        command, args = self.spec.command or "", self.spec.args
        if os.name == "posix":  # the same process, after saying its id (see the module docstring)
            command, args = "/bin/sh", ["-c", _LAUNCH, command, *args]
        params = StdioServerParameters(command=command, args=args, env=self.spec.env, cwd=self.spec.cwd)
        return stdio_client(params, errlog=errlog)

    async def close(self) -> None:
        """Close the session and stop the server (idempotent; bounded by :data:`CLOSE_TIMEOUT_S`)."""
        self._stop.set()
        self._gone = self._gone or "closed"
        task, self._task = self._task, None
        if task is not None and not task.done() and not self._ready.is_set():
            task.cancel()  # still starting: there is no session to end politely
            await asyncio.wait([task], timeout=CLOSE_TIMEOUT_S)
        elif task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_S)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing never fails the caller
                task.cancel()
                await asyncio.wait([task], timeout=CLOSE_TIMEOUT_S)
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
        self._end_group()  # what the server started goes with it
        if self._tail_transport is not None:
            self._tail_transport.close()
            self._tail_transport = None

    @property
    def gone(self) -> str | None:
        """Why the connection is closed for good, or None while it is usable."""
        return None if self._client is not None else (self._gone or "not open")

    # ---- requests -----------------------------------------------------------------------------

    async def list_tools(self) -> list[Tool]:
        """Every tool of the server (all pages)."""
        tools: list[Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a server whose pages never end cannot hang the start
            page = await self._request("tools/list", lambda c, at=cursor: c.list_tools(cursor=at))
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        """Call a tool; the result may be an error result (``is_error``) that the model reads.

        Raises:
            McpError: no answer in time (``gone=False``), the server is gone (``gone=True``),
                or an MCP error reply (``gone=False``), each naming the server and the tool.
        """
        return await self._request(f"tool {name!r}", lambda c: c.call_tool(name, arguments))

    async def _request(self, what: str, send: Any) -> Any:
        client = self._client
        if client is None:
            raise McpError(self._with_stderr(f"{self.label} is gone ({self.gone})"), gone=True)
        try:
            # The SDK's own timeout answers first; this one also bounds what it does not cover.
            return await asyncio.wait_for(send(client), self.call_timeout_s + 5.0)
        except TimeoutError:
            raise McpError(f"{self.label} did not answer {what} within {self.call_timeout_s:g} s",
                           timed_out=True) from None
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise McpError(f"{self.label} did not answer {what} within {self.call_timeout_s:g} s",
                               timed_out=True) from None
            if exc.code == CONNECTION_CLOSED:
                self._mark_gone("it closed the connection")
                await self._stderr_done()
                raise McpError(self._with_stderr(f"{self.label} exited during {what}"),
                                     gone=True) from None
            raise McpError(f"{self.label} refused {what}: {exc.message}") from None
        except ValidationError as exc:  # a reply of the wrong shape: that call failed, the connection did not
            problem = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(part) for part in problem.get("loc", ()))
            raise McpError(f"{self.label} answered {what} with a malformed result ({exc.title}: {where}: "
                           f"{problem.get('msg', 'invalid')})") from None
        except Exception as exc:  # noqa: BLE001 - a broken stream or transport: the connection is unusable
            self._mark_gone(_describe_failure(exc))
            raise McpError(self._with_stderr(f"{self.label} failed during {what}: {_describe_failure(exc)}"),
                                 gone=True) from None

    async def _stderr_done(self) -> None:
        """Give an exiting server a moment to finish writing why (its stderr reaches EOF when it exits)."""
        if self._tail is not None:
            try:
                await asyncio.wait_for(self._tail.closed.wait(), 1.0)
            except TimeoutError:
                pass

    def _mark_gone(self, reason: str) -> None:
        self._gone = reason
        self._client = None
        self._stop.set()

    def _with_stderr(self, message: str) -> str:
        """``message`` and the last lines the server wrote to stderr (the last first: it says why)."""
        tail = self._tail.text() if self._tail is not None else ""
        lines = [line.strip() for line in tail.splitlines() if line.strip()][-8:]
        return f"{message}; stderr: {' | '.join(reversed(lines))}" if lines else message


def _missing_command(spec: McpServerSpec) -> str | None:
    """Why ``spec.command`` cannot be run, or None (the launch line's shell would say it less clearly)."""
    command = spec.command or ""
    if os.sep in command:
        path = command if os.path.isabs(command) else os.path.join(spec.cwd or os.getcwd(), command)
        if not os.path.exists(path):
            return f"No such file or directory: {command!r}"
        return None if os.access(path, os.X_OK) else f"Permission denied: {command!r} is not executable"
    search = (spec.env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    return None if shutil.which(command, path=search) else f"No such file or directory: {command!r} is not on PATH"


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel (a zombie then counts as alive)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in group ``pgid`` (the server and what it started); gone already is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
