"""Our servers over MCP: ``nemo-gym-env serve NAMES --mcp`` as a real process, driven by the MCP SDK's own
client. A scripted episode over MCP gives the same tool outputs and the same reward as the same moves
through ``gym.make``, on four bundled servers (git_history itself sits on an MCP server), in both of the
protocol's forms: the ``initialize`` handshake (the MCP session is the episode) and the current
per-request form (the episode named by the ``X-NeMo-Gym-Session-Token`` header)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import httpx
import httpx2
import pytest

pytest.importorskip("mcp")

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import nemo_gym_env  # noqa: F401 - registers the envs
from nemo_gym_env.launch.catalog import bundled_dataset
from nemo_gym_env.protocol.items import final_answer
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.mcp_episodes import SESSION_TOKEN_HEADER
from nemo_gym_env.server.mcp_expose import HARNESS_META
from tests.conftest import example_rows, scripted
from tests.server.mcp_serving import start_serve, stop_serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SERVERS = ("example_multi_step", "badge_lookup", "example_session_state_mgmt", "git_history")
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, str]]:
    proc, urls = start_serve(*SERVERS, "--mcp")
    try:
        yield urls
    finally:
        stop_serve(proc)


# ---- playing one scripted episode both ways -------------------------------------------------


def play_env(url: str, server: str, task_index: int, correct: bool) -> tuple[float, list[str]]:
    """The scripted player through gym.make against the served server: the reward and every tool output."""
    env = gym.make(f"NemoGym/{server}-v0", base_url=url, dataset=str(bundled_dataset(server)))
    try:
        env.reset(options={"task_index": task_index})
        row, history, outputs = env.unwrapped.task, [], []
        for _ in range(50):
            action = scripted(server)(row, history, correct=correct)
            observation, _, terminated, truncated, info = env.step(action)
            history.extend(observation)
            outputs += [item["output"] for item in observation if item.get("type") == "function_call_output"]
            if terminated or truncated:
                assert terminated, info
                return env.unwrapped.last_verify["reward"], outputs
        raise AssertionError("the episode did not end")
    finally:
        env.close()


async def play_mcp(client: Client, server: str, row: dict[str, Any], correct: bool) -> tuple[float, list[str]]:
    """The same player over MCP, once the episode is seeded: tools/call per call, verify with the answer."""
    history: list[dict[str, Any]] = []
    outputs: list[str] = []
    for _ in range(50):
        action = scripted(server)(row, history, correct=correct)
        calls = [item for item in action if item.get("type") == "function_call"]
        if not calls:
            verdict = await client.call_tool("verify", {"answer": final_answer(action)})
            assert not verdict.is_error, verdict
            return verdict.structured_content["reward"], outputs
        for call in calls:
            result = await client.call_tool(call["name"], json.loads(call["arguments"]))
            text = result.content[0].text
            outputs.append(text)
            history.append({"type": "function_call_output", "call_id": call["call_id"], "output": text})
    raise AssertionError("the episode did not end")


def _tool_view(tools: list[Any]) -> list[tuple[str, Any]]:
    return [(tool.name, tool.input_schema) for tool in tools]


def _row_view(row: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(t["name"], t["parameters"]) for t in row["responses_create_params"].get("tools") or []]


async def mcp_handshake_episode(url: str, server: str, task_index: int, correct: bool) -> tuple[float, list[str]]:
    """The protocol's handshake form: one MCP session is one episode, named by its index."""
    row = example_rows(server)[task_index]
    async with Client(url + "/mcp", mode="legacy") as client:
        before = (await client.list_tools()).tools
        assert [t.name for t in before[-3:]] == ["verify", "seed_session", "close_session"]  # every callable name
        assert [bool((t.meta or {}).get(HARNESS_META)) for t in before[-3:]] == [False, True, True]
        seeded = await client.call_tool("seed_session", {"task_index": task_index})
        assert seeded.structured_content["task_index"] == task_index
        tools = (await client.list_tools()).tools
        model = [t for t in tools if not (t.meta or {}).get(HARNESS_META)]  # what a model should see
        assert _tool_view(model) == [*_row_view(row), ("verify", model[-1].input_schema)]  # what the env shows
        assert [t.name for t in tools[len(model):]] == ["seed_session", "close_session"]
        return await play_mcp(client, server, row, correct)


async def mcp_token_episode(url: str, server: str, task_index: int, correct: bool) -> tuple[float, list[str]]:
    """The current per-request form: the episode seeded with the whole row, then named by its token."""
    row = example_rows(server)[task_index]
    async with Client(url + "/mcp") as opener:
        seeded = await opener.call_tool("seed_session", {"row": row})
    headers = seeded.structured_content["headers"]
    assert seeded.structured_content["input"][-1]["content"] == row["responses_create_params"]["input"][-1]["content"]
    async with Client(streamable_http_client(url + "/mcp", http_client=httpx2.AsyncClient(headers=headers))) as client:
        assert _tool_view((await client.list_tools()).tools)[:-3] == _row_view(row)
        return await play_mcp(client, server, row, correct)


@pytest.mark.parametrize("server", SERVERS)
def test_an_episode_over_mcp_scores_what_the_same_moves_score_through_gym_make(served, server):
    url = served[server]
    for task_index, correct, form in [(0, True, mcp_handshake_episode), (0, False, mcp_token_episode),
                                      (1, True, mcp_token_episode)]:
        expected = play_env(url, server, task_index, correct)
        assert expected[0] == (1.0 if correct else 0.0)
        assert asyncio.run(form(url, server, task_index, correct)) == expected, (task_index, correct, form.__name__)


# ---- NeMo Gym 0.7's way: seed and verify over HTTP, tools over MCP ---------------------------


def test_an_http_seed_hands_out_the_token_of_its_own_session(served):
    url = served["example_session_state_mgmt"]
    row = example_rows("example_session_state_mgmt")[0]
    with httpx.Client(base_url=url, timeout=60) as http:
        access = http.post("/seed_session", json=row).json()["mcp"]
        assert access["url_path"] == "/mcp" and access["transport"] == "http"
        before = http.post("/get_counter_value", json={}).json()["count"]
        # raw JSON-RPC as 0.7's agents send it (no handshake), from another client: the token names the session
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "increment_counter", "arguments": {"count": row["expected_count"] - before}}}
        reply = httpx.post(f"{url}/mcp", json=call, headers={**ACCEPT, **access["headers"]}, timeout=60)
        assert reply.status_code == 200 and reply.json()["result"]["isError"] is False
        assert http.post("/get_counter_value", json={}).json()["count"] == row["expected_count"]
        verdict = http.post("/verify", json={**row, "response": make_response([]).model_dump(mode="json")}).json()
        assert verdict["reward"] == 1.0
        typed = http.post("/seed_session", json={"resources_session_id": "s1", "episode_id": {"rollout_id": "r1"},
                                                 "task_id": {"taskset": "t", "task_id": "0"}, "task_data": row}).json()
        assert typed["resources_session_id"] == "s1" and SESSION_TOKEN_HEADER in typed["resources_tools"]["headers"]


# ---- hostile clients -------------------------------------------------------------------------


def test_malformed_json_rpc_gets_a_clear_error_and_the_server_goes_on(served):
    url = served["example_multi_step"] + "/mcp"
    for body in (b"{not json", b"[]", b'{"hello": "world"}', b'{"jsonrpc": "2.0", "id": 1, "method": 7}',
                 json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 5}}).encode()):
        reply = httpx.post(url, content=body, headers=ACCEPT, timeout=60)
        assert 400 <= reply.status_code < 500, (body, reply.status_code, reply.text)
        assert "error" in reply.json()
    no_accept = httpx.post(url, content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}',
                           headers={"Content-Type": "application/json"}, timeout=60)
    assert 400 <= no_accept.status_code < 500 and "error" in no_accept.json()

    async def still_serves() -> list[str]:
        async with Client(url) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    assert "get_synonym_value" in asyncio.run(still_serves())


def test_unknown_tools_foreign_ids_and_finished_episodes_are_refused(served):
    url = served["example_multi_step"] + "/mcp"

    async def scenario() -> None:
        async with Client(url, mode="legacy") as client:
            with pytest.raises(MCPError, match="no episode: call seed_session first"):
                await client.call_tool("get_synonym_value", {"synonym": "x"})
            with pytest.raises(MCPError, match="exactly one of task_index or row"):
                await client.call_tool("seed_session", {})
            with pytest.raises(MCPError, match=r"task_index must be an integer in \[0, "):
                await client.call_tool("seed_session", {"task_index": 10**9})
            with pytest.raises(MCPError, match="not a task row"):
                await client.call_tool("seed_session", {"row": {"prompt": "hi"}})
            seeded = await client.call_tool("seed_session", {"task_index": 0})
            token = seeded.structured_content["session_token"]
            unknown = await client.call_tool("no_such_tool", {})
            assert unknown.is_error and json.loads(unknown.content[0].text) == {"detail": "Not Found"}  # the env's
            for name in ("aggregate_metrics", "../verify", "verify?answer=x", "get_synonym_value#x",
                         "get_synonym_value\n", "x" * 300):
                with pytest.raises(MCPError, match="is not a tool"):
                    await client.call_tool(name, {})
            with pytest.raises(MCPError, match="already plays an episode"):
                await client.call_tool("seed_session", {"task_index": 1})
            assert (await client.call_tool("verify", {"answer": "nothing"})).structured_content["reward"] == 0.0
        for wrong in ("forged-token", token):  # made up, and one whose episode is over
            headers = {SESSION_TOKEN_HEADER: wrong}
            async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))) as client:
                with pytest.raises(MCPError, match="names no live episode"):
                    await client.call_tool("get_synonym_value", {"synonym": "x"})

    asyncio.run(scenario())
    foreign = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={**ACCEPT, "Mcp-Session-Id": "0123456789abcdef"}, timeout=60)
    assert foreign.status_code == 404 and "Session not found" in foreign.text


def test_episodes_are_isolated_from_each_other(served):
    url = served["example_session_state_mgmt"] + "/mcp"

    async def counter(client: Client) -> int:
        return json.loads((await client.call_tool("get_counter_value", {})).content[0].text)["count"]

    async def scenario() -> None:
        async with Client(url, mode="legacy") as first, Client(url, mode="legacy") as second:
            await first.call_tool("seed_session", {"task_index": 0})
            await second.call_tool("seed_session", {"task_index": 0})
            start = example_rows("example_session_state_mgmt")[0]["initial_count"]
            await first.call_tool("increment_counter", {"count": 7})
            assert await counter(second) == start and await counter(first) == start + 7
            await second.call_tool("increment_counter", {"count": 2})
            assert await counter(first) == start + 7 and await counter(second) == start + 2

    asyncio.run(scenario())


def test_huge_arguments_are_refused_and_the_server_goes_on():
    name = "example_multi_step"
    proc, urls = start_serve(name, "--mcp", f"++{name}.resources_servers.{name}.max_body_bytes=100000")
    try:
        url = urls[name] + "/mcp"

        async def scenario() -> None:
            async with Client(url, mode="legacy") as client:
                await client.call_tool("seed_session", {"task_index": 0})
                with pytest.raises(MCPError, match="body of POST /mcp exceeds the 100000-byte limit"):
                    await client.call_tool("get_synonym_value", {"synonym": "x" * 200_000})
            async with Client(url, mode="legacy") as client:
                await client.call_tool("seed_session", {"task_index": 0})
                # under the body limit and the episode's trajectory cap (half the body limit by default)
                reply = await client.call_tool("get_synonym_value", {"synonym": "y" * 40_000})
                assert json.loads(reply.content[0].text) == {"synonym_value": ord("y") * 40_000}

        asyncio.run(scenario())
    finally:
        stop_serve(proc)


def test_abandoned_and_evicted_episodes_are_reaped():
    name = "example_multi_step"
    block = f"++{name}.resources_servers.{name}"
    proc, urls = start_serve(name, "--mcp", f"{block}.session_ttl_s=3", f"{block}.max_sessions=2")
    try:
        url = urls[name] + "/mcp"

        async def seed() -> str:
            async with Client(url) as client:
                return (await client.call_tool("seed_session", {"task_index": 0})).structured_content["session_token"]

        async def alive(token: str) -> bool:
            headers = {SESSION_TOKEN_HEADER: token}
            async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))) as client:
                try:
                    await client.call_tool("get_synonym_value", {"synonym": "x"})
                except MCPError:
                    return False
                return True

        async def scenario() -> None:
            first, second, third = await seed(), await seed(), await seed()
            assert not await alive(first)  # the cap of 2: the oldest went
            assert await alive(second) and await alive(third)
            await asyncio.sleep(4)
            assert not await alive(second) and not await alive(third)  # the idle TTL of 3 s

        asyncio.run(scenario())
    finally:
        stop_serve(proc)


def test_a_conversation_is_played_over_mcp_as_through_gym_make():
    """A Gymnasium-protocol server over MCP (retail_support): each tool call and each message to the simulated
    customer is one /step; the customer's answers, the end and the reward are the ones gym.make gives."""
    server = "retail_support"
    row = example_rows(server)[1]  # an exchange: the longest conversation
    proc, urls = start_serve(server, "--mcp")
    try:
        env = gym.make(f"NemoGym/{server}-v0", base_url=urls[server], dataset=str(bundled_dataset(server)))
        env.reset(options={"task_index": 1})
        history, heard = [], []
        for _ in range(20):
            observation, _, terminated, _, _ = env.step(scripted(server)(row, history))
            history.extend(observation)
            heard += [item["content"] for item in observation if item.get("role") == "user"]
            if terminated:
                break
        env.close()
        assert env.unwrapped.last_verify["reward"] == 1.0 and len(heard) >= 2

        async def over_mcp() -> tuple[dict, list[str], list[str]]:
            async with Client(urls[server] + "/mcp", mode="legacy") as client:
                listed = [t.name for t in (await client.list_tools()).tools]
                assert listed == ["send_message", "seed_session", "close_session"]  # no verify: steps are scored
                seeded = (await client.call_tool("seed_session", {"task_index": 1})).structured_content
                assert seeded["observation"] == row["user"]["opening"] and seeded["tools"][-1] == "send_message"
                tools = [t.name for t in (await client.list_tools()).tools]
                assert tools == [*(t["name"] for t in row["responses_create_params"]["tools"]), "send_message",
                                 "seed_session", "close_session"]
                with pytest.raises(MCPError, match="has no verify"):
                    await client.call_tool("verify", {"answer": "done"})
                steps: list[dict[str, Any]] = []
                said: list[str] = []
                for _ in range(20):
                    action = scripted(server)(row, steps)
                    if action[0]["type"] == "function_call":
                        result = await client.call_tool(action[0]["name"], json.loads(action[0]["arguments"]))
                        assert not result.is_error
                        steps.append({"type": "function_call_output", "call_id": "c", "output": result.content[0].text})
                        continue
                    step = (await client.call_tool("send_message", {"text": final_answer(action)})).structured_content
                    if step["terminated"]:
                        return step, said, tools
                    said.append(step["observation"])
                    steps.append({"type": "message", "role": "user", "content": step["observation"]})
                raise AssertionError("the conversation did not end")

        last, said, _ = asyncio.run(over_mcp())
        assert said == heard  # the customer answered the same words
        assert last["reward"] == 1.0 and last["info"]["state"] == 1.0 and last["info"]["ended_by"] == "user"
        assert last["step_rewards"][-1] == 1.0
    finally:
        stop_serve(proc)


def test_a_failing_user_model_over_mcp_is_an_error_and_ends_the_episode():
    from tests.fixtures.openai_server import running_server

    server = "retail_support"
    key = f"++{server}.resources_servers.{server}"
    with running_server() as endpoint:
        proc, urls = start_serve(server, "--mcp", f"{key}.user=policy", f"{key}.user_timeout_s=1",
                                 f"{key}.user_policy={{kind: openai, model: hang-u, base_url: '{endpoint}', api: chat}}")
        try:
            async def scenario() -> None:
                async with Client(urls[server] + "/mcp", mode="legacy") as client:
                    await client.call_tool("seed_session", {"task_index": 0})
                    failed = await client.call_tool("send_message", {"text": "Hello, your email?"})
                    assert failed.is_error and "the user model did not answer within 1 s" in failed.content[0].text
                    with pytest.raises(MCPError, match="no episode"):  # it ended: nothing to go on with
                        await client.call_tool("send_message", {"text": "Hello?"})

            asyncio.run(scenario())
        finally:
            stop_serve(proc)


def test_a_server_of_neither_protocol_refuses_mcp_clearly():
    from fastapi import FastAPI

    from nemo_gym_env.errors import ConfigError
    from nemo_gym_env.server.mcp_expose import expose_over_mcp
    from nemo_gym_env.servers.guess_number.app import GuessNumberServer

    server = GuessNumberServer.from_config({})
    with pytest.raises(ConfigError, match="speaks neither; serve it without --mcp"):
        expose_over_mcp(server, FastAPI())


def _initialize(url: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    return httpx.post(url, json=body, headers=ACCEPT, timeout=30)


def _ping(url: str, mcp_session: str) -> int:
    body = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    headers = {**ACCEPT, "mcp-session-id": mcp_session, "mcp-protocol-version": "2025-06-18"}
    return httpx.post(url, json=body, headers=headers, timeout=30).status_code


def test_at_the_cap_the_least_recently_used_idle_handshake_session_makes_room():
    """Abandoned handshake sessions (opened, never closed) no longer lock new clients out with 503 until they
    expire: the least recently used idle one ends, and so does its episode."""
    name = "example_multi_step"
    block = f"++{name}.resources_servers.{name}"
    proc, urls = start_serve(name, "--mcp", f"{block}.max_sessions=3")
    try:
        url = urls[name] + "/mcp"
        opened = []
        for _ in range(3):
            reply = _initialize(url)
            assert reply.status_code == 200, reply.text
            opened.append(reply.headers["mcp-session-id"])
        assert _ping(url, opened[0]) == 200  # used: the second is now the least recently used
        for _ in range(4):
            reply = _initialize(url)
            assert reply.status_code == 200, reply.text  # was 503 "Too many open sessions" until the TTL
            opened.append(reply.headers["mcp-session-id"])
        alive = [sid for sid in opened if _ping(url, sid) == 200]
        assert alive == opened[-3:]  # the newest three; every evicted one answers 404 now
        assert _ping(url, opened[1]) == 404
    finally:
        stop_serve(proc)


def test_an_episodes_trajectory_is_capped_and_the_episode_still_scores():
    """40 calls of 5 MiB arguments grew the server by 900 MiB and made the episode's /verify too large to send;
    the trajectory now has a cap: the call that would pass it is refused naming it, and verify scores."""
    name = "example_single_tool_call"
    block = f"++{name}.resources_servers.{name}"
    proc, urls = start_serve(name, "--mcp", f"{block}.mcp_max_trajectory_bytes=120000")
    try:
        url = urls[name] + "/mcp"

        async def scenario() -> None:
            async with Client(url, mode="legacy") as client:
                await client.call_tool("seed_session", {"task_index": 0})
                results = []
                for _ in range(10):  # each call records 25 kB of arguments and an output that echoes them
                    results.append(await client.call_tool("get_weather", {"city": "x" * 25_000}))
                    if results[-1].is_error:
                        break
                refused = results[-1]
                assert refused.is_error and "trajectory past its cap" in refused.content[0].text
                assert "cap of 120,000 bytes" in refused.content[0].text  # the cap, named
                assert 2 <= len(results) <= 5  # 120 kB hold two or three such calls, never ten
                assert not any("trajectory past its cap" in r.content[0].text for r in results[:-1])
                with pytest.raises(MCPError, match=r"the answer \(40,000 bytes\) passes the cap on an answer"):
                    await client.call_tool("verify", {"answer": "s" * 40_000})  # a quarter of 120 kB: 30 kB
                verdict = await client.call_tool("verify", {"answer": "It is sunny."})
                assert not verdict.is_error and verdict.structured_content["reward"] in (0.0, 1.0)

        asyncio.run(scenario())
    finally:
        stop_serve(proc)
