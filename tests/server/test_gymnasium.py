"""The server kit's ``GymnasiumServer`` (``server/gymnasium.py``), served as a real process on
127.0.0.1 (``tests/fixtures/servers/protocols/countdown_app.py``): NeMo Gym's ``/reset`` and
``/step`` wire, the session cookie, state freed when an episode ends, and what differs on
purpose (409 for a step of no live episode, 500 for a reward that is not a number)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.scripting import assistant_message, function_call
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.gymnasium import GymnasiumServer, extract_text

from ..fixtures import fixture_specs

pytestmark = pytest.mark.slow

PARAMS = {"input": [{"role": "user", "content": "Count."}]}


def turn(text: str) -> dict[str, Any]:
    return make_response([assistant_message(text)]).model_dump(mode="json", exclude_none=True)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with Launcher(ready_timeout_s=60) as launcher:
        yield launcher.start(fixture_specs("protocols")["proto_countdown"]).url


@pytest.fixture
def client(url) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10) as c:
        yield c


def sessions(client: httpx.Client) -> int:
    return client.get("/_state").json()["sessions"]


def test_an_episode_on_nemo_gyms_wire(client):
    reset = client.post("/reset", json={"responses_create_params": PARAMS, "start": 2, "agent_ref": {"name": "x"}})
    assert reset.status_code == 200
    assert reset.json() == {"observation": "Count down from 2.", "info": {"start": 2}}
    assert any(name.startswith("CountdownServer___") for name in client.cookies)
    body = {"responses_create_params": PARAMS, "start": 2}
    first = client.post("/step", json={**body, "response": turn("1")})
    assert first.json() == {"observation": "Next.", "reward": 0.25, "terminated": False, "truncated": False,
                            "info": {"left": 1}}
    wrong = client.post("/step", json={**body, "response": turn("7")}).json()
    assert (wrong["reward"], wrong["observation"], wrong["terminated"]) == (-0.5, "No.", False)
    last = client.post("/step", json={**body, "response": turn("0")}).json()
    assert (last["reward"], last["terminated"], last["truncated"], last["observation"]) == (1.0, True, False, None)


def test_state_is_freed_when_the_episode_ends_and_a_further_step_is_409(client):
    before = sessions(client)
    client.post("/reset", json={"responses_create_params": PARAMS, "start": 1})
    assert sessions(client) == before + 1
    done = client.post("/step", json={"responses_create_params": PARAMS, "response": turn("0")})
    assert done.json()["terminated"]
    assert sessions(client) == before
    again = client.post("/step", json={"responses_create_params": PARAMS, "response": turn("-1")})
    assert again.status_code == 409 and "has ended" in again.json()["error"]


def test_a_step_of_an_episode_never_started_is_409(url):
    with httpx.Client(base_url=url, timeout=10) as fresh:  # no cookie
        reply = fresh.post("/step", json={"responses_create_params": PARAMS, "response": turn("1")})
    assert reply.status_code == 409 and "never started" in reply.json()["error"]


def test_a_reset_with_the_same_cookie_starts_over(client):
    client.post("/reset", json={"responses_create_params": PARAMS, "start": 5})
    client.post("/reset", json={"responses_create_params": PARAMS, "start": 2})
    reply = client.post("/step", json={"responses_create_params": PARAMS, "response": turn("1")})
    assert reply.json()["reward"] == 0.25  # counting from 2, not 5


def test_sessions_are_kept_apart_by_cookie(url):
    with httpx.Client(base_url=url, timeout=10) as a, httpx.Client(base_url=url, timeout=10) as b:
        a.post("/reset", json={"responses_create_params": PARAMS, "start": 3})
        b.post("/reset", json={"responses_create_params": PARAMS, "start": 9})
        assert a.post("/step", json={"responses_create_params": PARAMS, "response": turn("2")}).json()["reward"] == 0.25
        assert b.post("/step", json={"responses_create_params": PARAMS, "response": turn("8")}).json()["reward"] == 0.25


def test_a_non_finite_reward_from_step_is_a_500_naming_it(client):
    client.post("/reset", json={"responses_create_params": PARAMS, "bad_reward": True})
    reply = client.post("/step", json={"responses_create_params": PARAMS, "bad_reward": True, "response": turn("1")})
    assert reply.status_code == 500 and "not a finite number" in reply.text


@pytest.mark.parametrize("body", [{}, {"responses_create_params": {}}, {"responses_create_params": PARAMS}])
def test_malformed_bodies_get_a_4xx(client, body):
    route = "/step" if "responses_create_params" in body and body["responses_create_params"] else "/reset"
    if route == "/step":
        client.post("/reset", json={"responses_create_params": PARAMS})
    reply = client.post(route, json=body)
    assert 400 <= reply.status_code < 500, reply.text


def test_routes_are_nemo_gyms_for_this_kind_of_server(client):
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {"/reset", "/step", "/aggregate_metrics"} <= paths
    for route in ("/seed_session", "/verify", "/close_session"):
        assert client.post(route, json={}).status_code == 404
    for route in ("/", "/health", "/healthz", "/readyz", "/livez"):
        assert client.get(route).json() == {"status": "ok"}


def test_extract_text_and_tool_output():
    response = make_response([assistant_message("<action>hit"), function_call(0, 0, "f", {"a": 1}),
                              assistant_message("</action>", "msg_2")])
    assert extract_text(response) == "<action>hit</action>"
    call = response.output[1]
    assert GymnasiumServer.tool_output(call, {"ok": True}) == {"call_id": call.call_id, "output": '{"ok": true}'}
