"""In-process tests of the ``example_session_state_mgmt`` server and its scripted player."""

from __future__ import annotations

import base64
import doctest
import json
from pathlib import Path
from typing import Any

import itsdangerous
import pytest
from fastapi.testclient import TestClient

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import (
    app_client,
    assistant_message,
    example_rows,
    play,
    server_config,
    verify,
)
from nemo_gym_env.servers.example_session_state_mgmt import app as app_module
from nemo_gym_env.servers.example_session_state_mgmt import scripted

NAME = "example_session_state_mgmt"
HERE = Path(__file__).resolve().parent.parent


Server = app_module.StatefulCounterResourcesServer

ROWS = example_rows(HERE)
JSON = {"content-type": "application/json"}
ROW = ROWS[0]
DONE = [assistant_message("Done.")]
"""A final turn that says nothing: the reward is the session's counter alone."""


@pytest.fixture
def server():
    return Server.from_config({}, name=NAME)


@pytest.fixture
def app(server):
    return server.build_app()


@pytest.fixture
def client(server):
    with app_client(server) as c:
        yield c


def count(client: TestClient) -> int:
    reply = client.post("/get_counter_value", json={})
    assert reply.status_code == 200, reply.text
    return reply.json()["count"]


# ---- tools and routes -------------------------------------------------------------------


def test_seed_then_tools(client: TestClient) -> None:
    assert client.post("/seed_session", json=ROW).json() == {}
    assert count(client) == ROW["initial_count"]
    assert client.post("/increment_counter", json={"count": 4}).json() == {"success": True}
    assert client.post("/increment_counter", json={"count": -1}).json() == {"success": True}
    assert count(client) == ROW["initial_count"] + 3


def test_get_counter_value_accepts_an_empty_object_or_no_body(client: TestClient) -> None:
    client.post("/seed_session", json=ROW)
    assert client.post("/get_counter_value", json={}).json() == {"count": ROW["initial_count"]}
    assert client.post("/get_counter_value", content=b"{}", headers=JSON).json() == {
        "count": ROW["initial_count"]
    }
    assert client.post("/get_counter_value").json() == {"count": ROW["initial_count"]}


def test_tools_without_seed_start_at_zero(server, client: TestClient) -> None:
    assert count(client) == 0
    assert len(server.sessions) == 0  # reading stores nothing
    client.post("/increment_counter", json={"count": 2})
    assert count(client) == 2


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/increment_counter", {"count": "three"}),
        ("/increment_counter", {"count": 1.5}),
        ("/increment_counter", {"count": None}),
        ("/increment_counter", {}),
        ("/increment_counter", [1]),
        ("/get_counter_value", [1]),
        ("/seed_session", {"initial_count": "many"}),
    ],
)
def test_wrong_types_are_422_naming_the_route(client: TestClient, route: str, body: Any) -> None:
    reply = client.post(route, json=body)
    assert reply.status_code == 422
    assert route in reply.json()["error"]


def test_unknown_tool_is_404(client: TestClient) -> None:
    assert client.post("/reset_counter", json={}).status_code == 404


@pytest.mark.parametrize("route", ["/increment_counter", "/get_counter_value", "/seed_session"])
def test_non_json_body_is_4xx(client: TestClient, route: str) -> None:
    reply = client.post(route, content=b"count=3", headers=JSON)
    assert 400 <= reply.status_code < 500
    assert route in reply.json()["error"]


# ---- verify -----------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_play_gets_1(client: TestClient, index: int) -> None:
    result = play(client, ROWS[index], scripted.scripted_action, correct=True)
    assert result["reward"] == 1.0
    assert "failure_reason" not in result


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_play_gets_0(client: TestClient, index: int) -> None:
    result = play(client, ROWS[index], scripted.scripted_action, correct=False)
    assert result["reward"] == 0.0
    assert "failure_reason" not in result


def test_scripted_final_message_reports_the_count(client: TestClient) -> None:
    result = play(client, ROWS[2], scripted.scripted_action, correct=True)
    assert (
        result["response"]["output"][-1]["content"][0]["text"]
        == f"The counter now reads {ROWS[2]['expected_count']}."
    )


def test_verify_without_cookie_gets_0_with_reason(app) -> None:
    with TestClient(app) as seeded, TestClient(app) as stranger:
        seeded.post("/seed_session", json={**ROW, "initial_count": ROW["expected_count"]})
        result = verify(stranger, ROW, DONE)
        assert result["reward"] == 0.0
        assert result["failure_reason"] == app_module.NO_SESSION_REASON
        assert verify(seeded, ROW, DONE)["reward"] == 1.0


def test_two_clients_do_not_share_counters(app) -> None:
    with TestClient(app) as a, TestClient(app) as b:
        a.post("/seed_session", json={**ROW, "initial_count": 10})
        b.post("/seed_session", json={**ROW, "initial_count": 100})
        a.post("/increment_counter", json={"count": 1})
        b.post("/increment_counter", json={"count": 5})
        assert (count(a), count(b)) == (11, 105)
        assert verify(a, {**ROW, "expected_count": 11}, DONE)["reward"] == 1.0
        assert verify(b, {**ROW, "expected_count": 105}, DONE)["reward"] == 1.0


def _forge(session_id: str, secret: str) -> str:
    """A Starlette session cookie for ``session_id`` signed with ``secret``."""
    payload = base64.b64encode(json.dumps({"session_id": session_id}).encode())
    return itsdangerous.TimestampSigner(secret).sign(payload).decode()


def _post_lost(client: TestClient, route: str, body: dict[str, Any]) -> None:
    """POST that must be refused with 410 (session lost), setting no new cookie."""
    reply = client.post(route, json=body)
    assert reply.status_code == 410, reply.text
    assert "session" in reply.json()["error"] and "set-cookie" not in reply.headers


@pytest.mark.parametrize("secret", ["StatefulCounterResourcesServer", "guessed-secret", ""])
def test_forged_cookie_reaches_no_state(server, app, secret: str) -> None:
    cookie_name = server.session_cookie_name()
    verify_body = {**ROW, "response": make_response(DONE).model_dump(mode="json")}
    with TestClient(app) as victim, TestClient(app) as attacker:
        victim.post("/seed_session", json={**ROW, "initial_count": ROW["expected_count"]})
        [victim_id] = list(server.sessions)
        attacker.cookies.set(cookie_name, _forge(victim_id, secret or "x"))
        _post_lost(attacker, "/get_counter_value", {})
        _post_lost(attacker, "/increment_counter", {"count": 1000})
        _post_lost(attacker, "/verify", verify_body)
        assert list(server.sessions) == [victim_id]  # the attacker created no session either
        # /seed_session starts over whatever cookie comes with it.
        assert attacker.post("/seed_session", json=ROW).status_code == 200
        assert count(attacker) == ROW["initial_count"]
        assert verify(victim, ROW, DONE)["reward"] == 1.0


def test_tampered_cookie_reaches_no_state(server, app) -> None:
    cookie_name = server.session_cookie_name()
    with TestClient(app) as victim, TestClient(app) as attacker:
        victim.post("/seed_session", json={**ROW, "initial_count": ROW["expected_count"]})
        genuine = victim.cookies.get(cookie_name)
        assert genuine
        attacker.cookies.clear()
        attacker.cookies.set(cookie_name, genuine[:-2] + ("AA" if not genuine.endswith("AA") else "BB"))
        _post_lost(attacker, "/verify", {**ROW, "response": make_response(DONE).model_dump(mode="json")})
        assert verify(victim, ROW, DONE)["reward"] == 1.0


def test_state_is_freed_after_verify(server, client: TestClient) -> None:
    client.post("/seed_session", json=ROW)
    assert len(server.sessions) == 1
    verify(client, ROW, DONE)
    assert len(server.sessions) == 0
    again = verify(client, ROW, DONE)
    assert again["reward"] == 0.0 and again["failure_reason"] == app_module.NO_SESSION_REASON


def test_seeding_again_restarts_the_counter(client: TestClient) -> None:
    client.post("/seed_session", json={**ROW, "initial_count": 3})
    client.post("/increment_counter", json={"count": 4})
    client.post("/seed_session", json={**ROW, "initial_count": 50})
    assert count(client) == 50


def test_verify_echoes_ground_truth(client: TestClient) -> None:
    row = ROWS[3]
    client.post("/seed_session", json=row)
    result = verify(client, {**row, "note": "kept"}, DONE)
    assert result["initial_count"] == row["initial_count"]
    assert result["expected_count"] == row["expected_count"]
    assert result["note"] == "kept"
    assert (
        result["responses_create_params"]["input"][0]["content"]
        == row["responses_create_params"]["input"][0]["content"]
    )


# ---- data, config, scripted player ------------------------------------------------------


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    for row in ROWS:
        app_module.StatefulCounterSeedSessionRequest.model_validate(row)
        assert isinstance(row["expected_count"], int)
        assert sum(scripted.increments(row)) == row["expected_count"] - row["initial_count"]
        tools = {tool["name"]: tool for tool in row["responses_create_params"]["tools"]}
        assert set(tools) == {"increment_counter", "get_counter_value"}
        for tool in tools.values():
            assert tool["type"] == "function" and tool["strict"] is True
            assert tool["parameters"]["additionalProperties"] is False
            assert set(tool["parameters"]["required"]) == set(tool["parameters"]["properties"])


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["verified"] is False and server["domain"] and server["description"]


def test_scripted_increments_follow_the_prompt() -> None:
    assert scripted.increments(ROWS[2]) == [3, 3, 7]
    assert scripted.increments(ROWS[2], correct=False) == [3, 3, 8]
    odd = {**ROWS[0], "expected_count": ROWS[0]["initial_count"] + 1}
    assert scripted.increments(odd) == [1]


def test_scripted_player_is_deterministic() -> None:
    first = scripted.scripted_action(ROWS[0], [])
    assert first == scripted.scripted_action(ROWS[0], [])
    assert [item["call_id"] for item in first] == [f"call_t0_{i}" for i in range(len(first))]


def test_scripted_doctest() -> None:
    assert doctest.testmod(scripted).failed == 0


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert 'if __name__ == "__main__":\n    StatefulCounterResourcesServer.run_webserver()' in source
    assert "from nemo_gym_env." in source and "from ." not in source
