"""How the env tells a server's protocol: GET on the routes that differ (405: there, 404: not), real servers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs import protocols
from nemo_gym_env.errors import ServerError

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[1] / "fixtures" / "servers" / "protocols" / "app.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def bare_server(request) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(APP), request.param, str(port)], stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1, trust_env=False)
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "the fixture server did not start"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _traits(url: str) -> protocols.ServerTraits:
    protocols._KNOWN.pop(url, None)  # told once per process: ask afresh
    return background_loop().run(protocols.server_traits(ResourcesClient(url)))


def test_our_resources_server_needs_no_close_session(launched):
    url = launched["example_multi_step"]
    assert httpx.get(f"{url}/verify", trust_env=False).headers[protocols.RELEASES_SESSION] == "true"
    assert _traits(url) == protocols.ServerTraits("resources", close_session=False, found_by="routes")


def test_get_verify_changes_nothing_and_post_verify_still_verifies(launched):
    from tests.conftest import example_rows

    url = launched["example_single_tool_call"]
    reply = httpx.get(f"{url}/verify", trust_env=False)
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"
    row = example_rows("example_single_tool_call")[0]
    with httpx.Client(base_url=url, trust_env=False) as client:
        assert client.post("/seed_session", json=row).status_code == 200
        verified = client.post("/verify", json={**row, "response": {
            "id": "r", "created_at": 0, "model": "m", "object": "response", "output": [], "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": []}})
    assert verified.status_code == 200 and "reward" in verified.json()


@pytest.mark.parametrize("bare_server", ["resources_close"], indirect=True)
def test_a_nemo_gym_07_resources_server_gets_close_session(bare_server):
    assert _traits(bare_server) == protocols.ServerTraits("resources", close_session=True, found_by="routes")


@pytest.mark.parametrize("bare_server", ["gymnasium"], indirect=True)
def test_reset_and_step_without_seed_session_is_the_gymnasium_protocol(bare_server):
    assert _traits(bare_server) == protocols.ServerTraits("gymnasium", found_by="routes")


@pytest.mark.parametrize("bare_server", ["neither"], indirect=True)
def test_a_server_of_neither_protocol_is_an_error_naming_the_routes_tried(bare_server):
    with pytest.raises(ServerError) as caught:
        _traits(bare_server)
    message = str(caught.value)
    assert "neither protocol" in message
    for route in ("/seed_session", "/reset", "/step", "/verify"):
        assert route in message
    assert bare_server not in protocols._KNOWN  # not remembered: a fixed server is asked again


def test_an_unreachable_server_is_asked_again():
    url = f"http://127.0.0.1:{_free_port()}"
    client = ResourcesClient(url, connect_retries=0)
    traits = background_loop().run(protocols.server_traits(client))
    assert traits.found_by == "unreachable" and url not in protocols._KNOWN
