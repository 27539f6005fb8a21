"""In-process tests of the ``example_multi_step`` server and its scripted player."""

from __future__ import annotations

import doctest
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import app_client, example_rows, function_call, play, server_config, verify
from nemo_gym_env.servers.example_multi_step import app as app_module
from nemo_gym_env.servers.example_multi_step import scripted

NAME = "example_multi_step"
HERE = Path(__file__).resolve().parent.parent


Server = app_module.ExampleMultiStepResourcesServer

ROWS = example_rows(HERE)
JSON = {"content-type": "application/json"}
GROUND_TRUTH = (
    "id",
    "expected_synonyms",
    "expected_synonym_values",
    "minefield_label",
    "minefield_label_value",
)


@pytest.fixture
def client():
    with app_client(Server, name=NAME) as c:
        yield c


def extract(values: Any, index: int = 0) -> dict[str, Any]:
    """A ``function_call`` of ``extract_synonym_values`` with ``values`` (call ``index`` of turn 0)."""
    return function_call(0, index, "extract_synonym_values", {"synonym_values": values})


# ---- tools and routes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("synonym", "value"), [("Wee", 87 + 101 + 101), ("Well-off", sum(map(ord, "Well-off"))), ("", 0)]
)
def test_get_synonym_value(client: TestClient, synonym: str, value: int) -> None:
    reply = client.post("/get_synonym_value", json={"synonym": synonym})
    assert reply.status_code == 200
    assert reply.json() == {"synonym_value": value}


def test_extract_synonym_values(client: TestClient) -> None:
    reply = client.post("/extract_synonym_values", json={"synonym_values": [3, 1, 2]})
    assert reply.status_code == 200
    assert reply.json() == {"success": True}
    assert client.post("/extract_synonym_values", json={"synonym_values": []}).json() == {"success": True}


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/get_synonym_value", {"synonym": 12}),
        ("/get_synonym_value", {}),
        ("/get_synonym_value", ["Wee"]),
        ("/extract_synonym_values", {"synonym_values": "1, 2"}),
        ("/extract_synonym_values", {"synonym_values": ["1", "2"]}),
        ("/extract_synonym_values", {"synonym_values": [1.5]}),
        ("/extract_synonym_values", {"synonym_values": [True]}),
        ("/extract_synonym_values", {}),
    ],
)
def test_wrong_types_are_422_naming_the_route(client: TestClient, route: str, body: Any) -> None:
    reply = client.post(route, json=body)
    assert reply.status_code == 422
    assert route in reply.json()["error"]


def test_unknown_tool_is_404(client: TestClient) -> None:
    assert client.post("/get_antonym_value", json={"synonym": "Wee"}).status_code == 404


@pytest.mark.parametrize("route", ["/get_synonym_value", "/extract_synonym_values"])
def test_non_json_body_is_4xx(client: TestClient, route: str) -> None:
    reply = client.post(route, content=b"synonym=Wee", headers=JSON)
    assert 400 <= reply.status_code < 500
    assert route in reply.json()["error"]


# ---- verify -----------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_play_gets_1(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = play(client, row, scripted.scripted_action, correct=True)
    assert result["reward"] == 1.0
    assert result["accuracy"] is True
    assert result["parsed_synonym_values"] == row["expected_synonym_values"]
    assert result["set_overlap"] == 1.0
    assert result["original_term_minefield_hit"] is False
    assert result["order_instruction_following_failure"] is False


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_play_gets_0(client: TestClient, index: int) -> None:
    result = play(client, ROWS[index], scripted.scripted_action, correct=False)
    assert result["reward"] == 0.0
    assert result["accuracy"] is False


def test_last_extract_call_is_the_answer(client: TestClient) -> None:
    row = ROWS[0]
    expected = row["expected_synonym_values"]
    assert verify(client, row, [extract([1, 2], 0), extract(expected, 1)])["reward"] == 1.0
    result = verify(client, row, [extract(expected, 0), extract([1, 2], 1)])
    assert result["reward"] == 0.0 and result["parsed_synonym_values"] == [1, 2]


@pytest.mark.parametrize(
    "item",
    [
        function_call(0, 0, "extract_synonym_values", "{not json"),
        function_call(0, 0, "extract_synonym_values", {"values": [1]}),
        function_call(0, 0, "extract_synonym_values", [1, 2]),
        function_call(0, 0, "extract_synonym_values", {"synonym_values": "801"}),
        function_call(0, 0, "extract_synonym_values", {"synonym_values": [True, False]}),
        function_call(0, 0, "get_synonym_value", {"synonym": "Famished"}),
    ],
)
def test_malformed_or_missing_answer_is_empty(client: TestClient, item: dict[str, Any]) -> None:
    result = verify(client, ROWS[0], [item])
    assert result["reward"] == 0.0
    assert result["parsed_synonym_values"] == []
    assert result["set_overlap"] == 0.0
    assert "failure_reason" not in result


def test_no_calls_at_all(client: TestClient) -> None:
    result = verify(client, ROWS[1], [])
    assert (result["reward"], result["parsed_synonym_values"], result["accuracy"]) == (0.0, [], False)


def test_metrics_order_overlap_and_minefield(client: TestClient) -> None:
    row = ROWS[0]
    expected = row["expected_synonym_values"]
    swapped = verify(client, row, [extract(list(reversed(expected)))])
    assert swapped["reward"] == 0.0 and swapped["set_overlap"] == 1.0
    assert swapped["order_instruction_following_failure"] is True
    assert swapped["original_term_minefield_hit"] is False

    partial = verify(client, row, [extract(expected[:1] + [row["minefield_label_value"]])])
    assert partial["set_overlap"] == pytest.approx(1 / len(expected))
    assert partial["original_term_minefield_hit"] is True
    assert partial["order_instruction_following_failure"] is False


def test_verify_echoes_ground_truth(client: TestClient) -> None:
    row = ROWS[2]
    result = verify(client, row, [extract(row["expected_synonym_values"])])
    for key in GROUND_TRUTH:
        assert result[key] == row[key]
    assert (
        result["responses_create_params"]["input"][1]["content"]
        == row["responses_create_params"]["input"][1]["content"]
    )


def test_verify_without_ground_truth_is_422(client: TestClient) -> None:
    row = {k: v for k, v in ROWS[0].items() if k != "expected_synonym_values"}
    response = make_response([extract([1])]).model_dump(mode="json")
    reply = client.post("/verify", json={**row, "response": response})
    assert reply.status_code == 422
    assert "expected_synonym_values" in reply.json()["error"]


def test_verify_of_a_row_that_already_has_metrics(client: TestClient) -> None:
    row = {**ROWS[3], "reward": 0.0, "accuracy": False, "parsed_synonym_values": [9]}
    result = verify(client, row, [extract(ROWS[3]["expected_synonym_values"])])
    assert result["reward"] == 1.0 and result["accuracy"] is True


# ---- data, config, scripted player ------------------------------------------------------


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    assert [row["id"] for row in ROWS] == list(range(5))
    for row in ROWS:
        app_module.ExampleMultiStepRunRequest.model_validate(row)
        assert row["expected_synonym_values"] == [
            app_module.synonym_value(s) for s in row["expected_synonyms"]
        ]
        assert row["minefield_label_value"] == app_module.synonym_value(row["minefield_label"])
        system = row["responses_create_params"]["input"][0]["content"]
        glossary = [
            line for line in system.splitlines() if line.startswith(f"- '{row['minefield_label']}' -> ")
        ]
        assert [line.split(" -> ")[1].strip("'") for line in glossary] == row["expected_synonyms"]
        # Distinct values, so a wrong order is always wrong.
        assert len(set(row["expected_synonym_values"])) == len(row["expected_synonym_values"])
        tools = {tool["name"]: tool for tool in row["responses_create_params"]["tools"]}
        assert set(tools) == {"get_synonym_value", "extract_synonym_values"}
        for tool in tools.values():
            assert tool["type"] == "function" and tool["strict"] is True
            assert tool["parameters"]["additionalProperties"] is False
            assert set(tool["parameters"]["required"]) == set(tool["parameters"]["properties"])


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["verified"] is False and server["domain"] and server["description"]


def test_scripted_player_turns() -> None:
    row = ROWS[0]
    first = scripted.scripted_action(row, [])
    assert [item["name"] for item in first] == ["get_synonym_value"] * len(row["expected_synonyms"])
    assert first == scripted.scripted_action(row, [])
    assert [item["call_id"] for item in first] == [f"call_t0_{i}" for i in range(len(first))]


@pytest.mark.parametrize("values", [[1, 2, 3], [5], [], [4, 4]])
def test_scripted_wrong_values_differ(values: list[int]) -> None:
    assert scripted.wrong_values(values) != values


def test_scripted_doctest() -> None:
    assert doctest.testmod(scripted).failed == 0


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert 'if __name__ == "__main__":\n    ExampleMultiStepResourcesServer.run_webserver()' in source
    assert "from nemo_gym_env." in source and "from ." not in source
