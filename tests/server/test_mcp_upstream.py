"""McpConnection against a real MCP server process (the SDK-built fixture ``tally.py``): every call
bounded, a server that hangs, exits, answers garbage, never speaks MCP or cannot start gives a clear error."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("mcp")

from nemo_gym_env.errors import McpError
from nemo_gym_env.server.mcp_upstream import McpConnection, McpServerSpec
from tests.fixtures import fixture_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TALLY = str(fixture_server("mcp_tally") / "tally.py")


def _connection(*args: str, call_timeout_s: float = 60.0, start_timeout_s: float = 60.0) -> McpConnection:
    return McpConnection(McpServerSpec(command="{python}", args=[TALLY, *args]), call_timeout_s=call_timeout_s,
                         start_timeout_s=start_timeout_s)


def test_spec_is_a_command_or_a_url_and_expands_placeholders():
    with pytest.raises(ValueError, match="either a 'command'"):
        McpServerSpec()
    with pytest.raises(ValueError, match="either a 'command'"):
        McpServerSpec(command="x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="http://"):
        McpServerSpec(url="file:///etc/passwd")
    spec = McpServerSpec(command="{python}", args=["--repository", "{session_dir}"], cwd="{session_dir}",
                         env={"TOKEN": "secret-value"}).expand({"session_dir": "/tmp/s1"})
    assert spec.args == ["--repository", "/tmp/s1"] and spec.cwd == "/tmp/s1" and "{python}" not in spec.command
    assert "secret-value" not in spec.describe()


def test_calls_hang_exit_and_errors_are_bounded_and_named():
    async def scenario() -> None:
        connection = _connection(call_timeout_s=2.0)
        await connection.open()
        names = {tool.name for tool in await connection.list_tools()}
        assert {"add", "score", "hang", "crash"} <= names
        assert (await connection.call_tool("add", {"amount": 2})).content[0].text == "total=2"
        bad = await connection.call_tool("add", {"amount": "two"})  # the tool's own error: a result the model reads
        assert bad.is_error and "amount" in bad.content[0].text
        unknown = await connection.call_tool("nope", {})
        assert unknown.is_error and "nope" in unknown.content[0].text
        started = time.monotonic()
        with pytest.raises(McpError, match="did not answer tool 'hang' within 2 s") as hung:
            await connection.call_tool("hang", {})
        assert time.monotonic() - started < 10 and hung.value.timed_out and not hung.value.gone
        assert (await connection.call_tool("add", {"amount": 1})).content[0].text == "total=3"  # still usable
        with pytest.raises(McpError, match="exited during tool 'crash'") as crashed:
            await connection.call_tool("crash", {})
        assert crashed.value.gone and "crashing on purpose" in str(crashed.value)
        with pytest.raises(McpError, match="is gone") as after:
            await connection.call_tool("add", {"amount": 1})
        assert after.value.gone and connection.gone
        await connection.close()
        await connection.close()  # twice is fine

    asyncio.run(scenario())


@pytest.mark.parametrize("mode,timeout_s,message", [("--garbage", 8.0, "did not start within 8 s"),
                                                    ("--exit-at-start", 120.0, "cannot start: no configuration")])
def test_a_server_that_never_speaks_mcp_or_exits_at_start_fails_the_open_in_time(mode, timeout_s, message):
    async def scenario() -> None:
        connection = _connection(mode, start_timeout_s=timeout_s)
        started = time.monotonic()
        with pytest.raises(McpError, match=message) as failed:
            await connection.open()
        assert failed.value.gone and time.monotonic() - started < timeout_s + 25

    asyncio.run(scenario())


def test_a_command_that_does_not_exist_says_so():
    async def scenario() -> None:
        connection = McpConnection(McpServerSpec(command="/nonexistent/mcp-server"), start_timeout_s=10)
        with pytest.raises(McpError, match="could not start: .*No such file"):
            await connection.open()

    asyncio.run(scenario())


def test_a_server_that_answers_garbage_fails_only_those_calls():
    """``liar.py`` shakes hands, then answers a call with a line that is not JSON, one with a result of the
    wrong shape, one with nothing: each of those calls fails on its own, and the connection goes on."""
    liar = str(fixture_server("mcp_tally") / "liar.py")

    async def scenario() -> None:
        connection = McpConnection(McpServerSpec(command="{python}", args=[liar]), call_timeout_s=2.0)
        await connection.open()
        for name, message in (("echo", "did not answer tool 'echo' within 2 s"),
                              ("wrong", r"answered tool 'wrong' with a malformed result \(CallToolResult: content"),
                              ("silent", "did not answer tool 'silent' within 2 s")):
            with pytest.raises(McpError, match=message) as failed:
                await connection.call_tool(name, {})
            assert not failed.value.gone
            assert (await connection.call_tool("ok", {})).content[0].text == "fine"
        await connection.close()

    asyncio.run(scenario())
