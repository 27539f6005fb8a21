"""The server kit's test helpers (``server.testing``), used by every bundled server's tests: each
helper does what it says and fails loudly when the server does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym_env.envs.env import NemoGymEnv
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers
from nemo_gym_env.server.testing import (
    app_client,
    assistant_message,
    example_rows,
    function_call,
    play,
    play_episode,
    reasoning,
    server_config,
    times_slower_than_plain,
    verify,
)
from nemo_gym_env.servers.example_session_state_mgmt.app import StatefulCounterResourcesServer as Counter
from nemo_gym_env.servers.example_session_state_mgmt.scripted import scripted_action

from ..conftest import scripted

COUNTER = "example_session_state_mgmt"
FOLDER = bundled_servers()[COUNTER]
ROWS = example_rows(FOLDER)


# ---- rows and configs -----------------------------------------------------------------------


def test_example_rows_reads_the_folders_data_and_skips_blank_lines(tmp_path: Path):
    assert ROWS == [json.loads(line) for line in bundled_dataset(COUNTER).read_text().splitlines() if line]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "example.jsonl").write_text('{"a": 1}\n\n  \n{"b": 2}\n')
    (tmp_path / "data" / "train.jsonl").write_text('{"c": 3}\n')
    assert example_rows(tmp_path) == [{"a": 1}, {"b": 2}]
    assert example_rows(str(tmp_path), "data/train.jsonl") == [{"c": 3}]


def test_server_config_is_the_instance_block_with_its_entrypoint():
    block = server_config(FOLDER, COUNTER)
    assert block["entrypoint"] == "app.py" and block["domain"]


@pytest.mark.parametrize(
    ("yaml", "problem"),
    [
        ("other:\n  resources_servers:\n    s:\n      entrypoint: app.py\n", "does not define s: "),
        ("s:\n  resources_servers:\n    t:\n      entrypoint: app.py\n", "does not define s: "),
        ("s:\n  resources_servers:\n    s:\n      entrypoint: gone.py\n", "no file 'gone.py'"),
        ("s:\n  resources_servers:\n    s:\n      domain: other\n", "no file None"),
        ("- a list\n", "does not define s"),
    ],
)
def test_server_config_fails_on_a_config_not_naming_the_server(tmp_path: Path, yaml: str, problem: str):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "s.yaml").write_text(yaml)
    (tmp_path / "app.py").write_text("")
    with pytest.raises(AssertionError, match=problem):
        server_config(tmp_path, "s")


# ---- the in-process client ------------------------------------------------------------------


def test_app_client_builds_a_class_under_its_name_or_serves_a_built_object():
    with app_client(Counter, {"max_sessions": 5}, name="counter") as client:
        reply = client.post("/seed_session", json=ROWS[0])
        assert reply.status_code == 200
        assert list(reply.cookies) == ["StatefulCounterResourcesServer___counter"]
    server = Counter.from_config({}, name="built")
    with app_client(server) as client:
        client.post("/seed_session", json=ROWS[0])
        assert len(server.sessions) == 1  # the very object given


def test_app_client_refuses_a_class_without_a_name_or_an_object_with_a_config():
    with pytest.raises(TypeError, match="instance name"):
        app_client(Counter, {})
    with pytest.raises(TypeError, match="already built"):
        app_client(Counter.from_config({}, name="x"), {"max_sessions": 5})
    with pytest.raises(TypeError, match="already built"):
        app_client(Counter.from_config({}, name="x"), name="y")


def test_app_client_passes_test_client_options():
    with app_client(Counter, name="c", cookies={"StatefulCounterResourcesServer___c": "forged"}) as client:
        assert client.post("/get_counter_value", json={}).status_code == 410


# ---- verify and play ------------------------------------------------------------------------


@pytest.fixture
def client():
    with app_client(Counter, name=COUNTER) as c:
        yield c


def test_verify_sends_the_row_and_a_response_with_the_rows_tools(client):
    client.post("/seed_session", json=ROWS[0])
    output = [reasoning("nothing to do"), assistant_message("Done.")]
    result = verify(client, {**ROWS[0], "note": "kept"}, output)
    assert result["note"] == "kept" and result["reward"] == 0.0
    assert [item["type"] for item in result["response"]["output"]] == ["reasoning", "message"]
    tools = [tool["name"] for tool in ROWS[0]["responses_create_params"]["tools"]]
    assert [tool["name"] for tool in result["response"]["tools"]] == tools


def test_verify_fails_on_a_reply_that_is_not_200(client):
    without_ground_truth = {k: v for k, v in ROWS[0].items() if k != "expected_count"}
    with pytest.raises(AssertionError, match="POST /verify: body.expected_count: Field required"):
        verify(client, without_ground_truth, [])


@pytest.mark.parametrize(("correct", "reward"), [(True, 1.0), (False, 0.0)])
def test_play_drives_the_player_in_the_seeded_session(client, correct, reward):
    row = ROWS[2]
    result = play(client, row, scripted_action, correct=correct)
    assert result["reward"] == reward
    output = result["response"]["output"]
    calls = [item for item in output if item["type"] == "function_call"]
    results = [item for item in output if item["type"] == "function_call_output"]
    assert [c["call_id"] for c in calls] == [r["call_id"] for r in results]  # each call got its output
    expected = row["expected_count"] + (0 if correct else 1)
    assert json.loads(results[-1]["output"]) == {"count": expected}  # read back in the same session
    assert output[-1]["content"][0]["text"] == f"The counter now reads {expected}."


def test_play_fails_when_the_player_never_finishes(client):
    def forever(row, history, *, correct=True):
        return [function_call(len(history), 0, "get_counter_value", {})]

    with pytest.raises(AssertionError, match="did not finish in 3 turns"):
        play(client, ROWS[0], forever, max_turns=3)


def test_play_fails_when_a_tool_call_is_refused(client):
    def confused(row, history, *, correct=True):
        return [function_call(0, 0, "reset_counter", {})]

    with pytest.raises(AssertionError, match="POST /reset_counter: 404"):
        play(client, ROWS[0], confused)


@pytest.mark.slow
def test_play_episode_plays_a_gymnasium_env(launched):
    env = NemoGymEnv(base_url=launched[COUNTER], dataset=ROWS)
    try:
        reward, terminated, truncated, info = play_episode(env, scripted(COUNTER), options={"task_index": 1})
        assert (reward, terminated, truncated) == (1.0, True, False) and info["reward"] == 1.0
        assert play_episode(env, scripted(COUNTER), correct=False, seed=3)[:3] == (0.0, True, False)
        with pytest.raises(AssertionError, match="did not end in 1 turns"):
            play_episode(env, scripted(COUNTER), max_turns=1, options={"task_index": 1})
    finally:
        env.close()


# ---- linear readers -------------------------------------------------------------------------


def _quadratic(text: str) -> int:
    """Scans the rest of the text at every ``{``: quadratic on a run of braces, linear on plain text."""
    return sum(text.count("}", i) for i, c in enumerate(text) if c == "{")


def test_times_slower_than_plain_tells_a_linear_reader_from_a_quadratic_one():
    adversarial = "{" * 30_000
    assert times_slower_than_plain(len, adversarial) < 50
    assert times_slower_than_plain(_quadratic, adversarial) > 50
