"""Servers answer only to their own names (DNS rebinding): ``nemo-gym-env serve --mcp`` as a real process, probed
over loopback with a foreign ``Host`` and ``Origin`` on every kind of route it serves: a resources server's own
routes, its MCP endpoint (driven by the MCP SDK's client too), and the head server."""

from __future__ import annotations

import asyncio

import httpx
import httpx2
import pytest

pytest.importorskip("mcp")

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.server.mcp_serving import start_serve, stop_serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAME = "example_single_tool_call"
EVIL = "evil.example"
ROW = {"responses_create_params": {"input": "What is the weather in Paris?"}}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def served():
    proc, urls = start_serve(NAME, "--mcp", head=True)
    try:
        yield urls
    finally:
        stop_serve(proc)


def test_a_foreign_host_gets_421_on_every_route(served):
    url, head = served[NAME], served["head_server"]
    for method, target, body in [("POST", f"{url}/seed_session", ROW), ("POST", f"{url}/get_weather", {"city": "x"}),
                                 ("POST", f"{url}/verify", {}), ("GET", f"{url}/", None),
                                 ("POST", f"{url}/mcp", INITIALIZE), ("GET", f"{head}/global_config_dict_yaml", None),
                                 ("GET", f"{head}/servers", None)]:
        for host in (EVIL, f"{EVIL}:80", "127.0.0.1.evil.example"):
            reply = httpx.request(method, target, json=body, headers={**MCP_HEADERS, "Host": host}, timeout=10)
            assert reply.status_code == 421, (method, target, host, reply.status_code, reply.text[:200])
            assert "answers only to its own names" in reply.json()["error"]
    # Its own names still answer.
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert httpx.post(f"{url}/seed_session", json=ROW, headers={"Host": host}, timeout=10).status_code == 200
    assert httpx.get(f"{head}/servers", timeout=10).json()[NAME] == url


def test_a_page_of_another_site_cannot_change_state(served):
    url = served[NAME]
    page = {"Origin": f"http://{EVIL}"}
    for target, body in [(f"{url}/seed_session", ROW), (f"{url}/mcp", INITIALIZE)]:
        reply = httpx.post(target, json=body, headers={**MCP_HEADERS, **page}, timeout=10)
        assert reply.status_code == 403, (target, reply.status_code, reply.text[:200])
        for origin in ("null", "file://", "http://localhost.evil.example:8000"):
            assert httpx.post(target, json=body, headers={**MCP_HEADERS, "Origin": origin},
                              timeout=10).status_code == 403, origin
    # A page of its own origin, and clients that send no Origin (the env, NeMo Gym's agent), are served.
    port = url.rsplit(":", 1)[1]
    own = httpx.post(f"{url}/seed_session", json=ROW, headers={"Origin": f"http://localhost:{port}"}, timeout=10)
    assert own.status_code == 200


def test_the_mcp_sdk_client_is_refused_under_a_foreign_name_and_served_under_its_own(served):
    url = served[NAME]

    async def scenario() -> None:
        evil = httpx2.AsyncClient(headers={"Host": EVIL, "Origin": f"http://{EVIL}"})
        with pytest.raises((MCPError, httpx2.HTTPStatusError, Exception)):
            async with Client(streamable_http_client(url + "/mcp", http_client=evil)) as client:
                await client.call_tool("seed_session", {"row": ROW})
        async with Client(url + "/mcp") as client:
            seeded = await client.call_tool("seed_session", {"row": ROW})
            assert not seeded.is_error and seeded.structured_content["session_token"]

    asyncio.run(scenario())


def test_allowed_hosts_widens_the_names_for_a_deliberate_remote_deployment():
    block = f"++{NAME}.resources_servers.{NAME}"
    proc, urls = start_serve(NAME, f"{block}.allowed_hosts=[gpu-7.internal]", "++head_server.allowed_hosts=[head.internal]",
                             head=True)
    try:
        url, head = urls[NAME], urls["head_server"]
        assert httpx.post(f"{url}/seed_session", json=ROW, headers={"Host": "gpu-7.internal:9000"},
                          timeout=10).status_code == 200
        assert httpx.post(f"{url}/seed_session", json=ROW, headers={"Host": EVIL}, timeout=10).status_code == 421
        assert httpx.get(f"{head}/servers", headers={"Host": "head.internal"}, timeout=10).status_code == 200
        assert httpx.get(f"{head}/servers", headers={"Host": EVIL}, timeout=10).status_code == 421
    finally:
        stop_serve(proc)
