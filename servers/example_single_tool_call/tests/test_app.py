"""In-process tests of the ``example_single_tool_call`` server and its scripted player."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym_env.protocol.types import BaseRunRequest
from nemo_gym_env.server.testing import (
    app_client,
    assistant_message,
    example_rows,
    function_call,
    play,
    server_config,
    verify,
)
from nemo_gym_env.servers.example_single_tool_call import app as app_module
from nemo_gym_env.servers.example_single_tool_call import scripted

NAME = "example_single_tool_call"
HERE = Path(__file__).resolve().parent.parent


Server = app_module.SimpleWeatherResourcesServer

ROWS = example_rows(HERE)
JSON = {"content-type": "application/json"}


@pytest.fixture
def client():
    with app_client(Server, name=NAME) as c:
        yield c


# ---- tools and routes -------------------------------------------------------------------


def test_get_weather(client: TestClient) -> None:
    reply = client.post("/get_weather", json={"city": "Quito"})
    assert reply.status_code == 200
    assert reply.json() == {"city": "Quito", "weather_description": "The weather in Quito is cold."}


def test_liveness(client: TestClient) -> None:
    assert client.get("/").json() == {"status": "ok"}


@pytest.mark.parametrize("body", [{"city": 7}, {"city": None}, {}, {"town": "Quito"}, [1, 2]])
def test_wrong_types_are_422_naming_the_route(client: TestClient, body: Any) -> None:
    reply = client.post("/get_weather", json=body)
    assert reply.status_code == 422
    assert "/get_weather" in reply.json()["error"]


def test_unknown_tool_is_404(client: TestClient) -> None:
    assert client.post("/get_forecast", json={"city": "Quito"}).status_code == 404


def test_non_json_body_is_4xx(client: TestClient) -> None:
    reply = client.post("/get_weather", content=b"city=Quito", headers=JSON)
    assert 400 <= reply.status_code < 500
    assert "/get_weather" in reply.json()["error"]


# ---- verify -----------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_play_gets_1(client: TestClient, index: int) -> None:
    result = play(client, ROWS[index], scripted.scripted_action, correct=True)
    assert result["reward"] == 1.0
    assert result["num_tool_calls"] == 1


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_play_gets_0(client: TestClient, index: int) -> None:
    result = play(client, ROWS[index], scripted.scripted_action, correct=False)
    assert result["reward"] == 0.0
    assert result["num_tool_calls"] == 0


@pytest.mark.parametrize(
    ("output", "reward", "num_tool_calls"),
    [
        ([], 0.0, 0),
        ([assistant_message("It is probably cold.")], 0.0, 0),
        ([function_call(0, 0, "get_weather", "{not json")], 0.0, 1),
        ([function_call(0, 0, "get_weather", {"city": ""})], 0.0, 1),
        ([function_call(0, 0, "get_weather", {"city": "   "})], 0.0, 1),
        ([function_call(0, 0, "get_weather", {"city": 3})], 0.0, 1),
        ([function_call(0, 0, "get_weather", ["Quito"])], 0.0, 1),
        ([function_call(0, 0, "get_time", {"city": "Quito"})], 0.0, 1),
        (
            [
                function_call(0, 0, "get_time", {"city": "Quito"}),
                function_call(0, 1, "get_weather", {"city": "Quito"}),
            ],
            1.0,
            2,
        ),
        (
            [function_call(0, 0, "get_weather", {"city": "Quito"}), assistant_message("Cold in Quito.")],
            1.0,
            1,
        ),
    ],
)
def test_verify_rule(client: TestClient, output: list, reward: float, num_tool_calls: int) -> None:
    result = verify(client, ROWS[0], output)
    assert result["reward"] == reward
    assert result["num_tool_calls"] == num_tool_calls
    assert "failure_reason" not in result


def test_verify_echoes_the_row(client: TestClient) -> None:
    row = {**ROWS[1], "extra_ground_truth": {"note": "kept"}}
    result = verify(client, row, [function_call(0, 0, "get_weather", {"city": "Lisbon"})])
    assert result["extra_ground_truth"] == {"note": "kept"}
    assert (
        result["responses_create_params"]["input"][1]["content"]
        == row["responses_create_params"]["input"][1]["content"]
    )
    assert result["response"]["output"][0]["name"] == "get_weather"


def test_verify_of_a_row_that_already_has_a_reward(client: TestClient) -> None:
    row = {**ROWS[0], "reward": 0.5, "num_tool_calls": 9}
    result = verify(client, row, [function_call(0, 0, "get_weather", {"city": "X"})])
    assert (result["reward"], result["num_tool_calls"]) == (1.0, 1)


def test_bad_verify_body_is_422(client: TestClient) -> None:
    reply = client.post("/verify", json=ROWS[0])
    assert reply.status_code == 422
    assert "/verify" in reply.json()["error"]


# ---- data, config, scripted player ------------------------------------------------------


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    for row in ROWS:
        BaseRunRequest.model_validate(row)
        [tool] = row["responses_create_params"]["tools"]
        assert tool["type"] == "function" and tool["name"] == "get_weather" and tool["strict"] is True
        params = tool["parameters"]
        assert params["additionalProperties"] is False
        assert set(params["required"]) == set(params["properties"]) == {"city"}


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["verified"] is False and server["domain"] and server["description"]


def test_scripted_player_reads_the_city() -> None:
    cities = [scripted.city_of(row) for row in ROWS]
    assert cities == ["Winnipeg", "Lisbon", "Nairobi", "Buenos Aires", "Hamburg"]


def test_scripted_player_is_deterministic() -> None:
    first = scripted.scripted_action(ROWS[0], [])
    assert first == scripted.scripted_action(ROWS[0], [])
    assert first[0]["call_id"] == "call_t0_0"


def test_scripted_doctest() -> None:
    assert doctest.testmod(scripted).failed == 0


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert 'if __name__ == "__main__":\n    SimpleWeatherResourcesServer.run_webserver()' in source
    assert "from nemo_gym_env." in source and "from ." not in source
