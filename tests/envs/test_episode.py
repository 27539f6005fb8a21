"""One episode (``envs.episode.Episode``), the state and steps the env and the vector env share,
against real server processes on 127.0.0.1: start, play, verify, finish, and tool arguments sent
as the model wrote them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.episode import Episode
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.dataset import input_items
from nemo_gym_env.protocol.scripting import assistant_message, function_call

from ..conftest import example_rows, scripted
from ..fixtures import fixture_specs

pytestmark = pytest.mark.slow

WEATHER = "example_single_tool_call"
COUNTER = "example_session_state_mgmt"


def run(coro: Any) -> Any:
    """Run an episode's coroutine on the background loop, as the env does."""
    return background_loop().run(coro, timeout=120)


def started(url: str, row: dict[str, Any], *, max_steps: int = 8) -> Episode:
    episode = Episode(ResourcesClient(url, timeout_s=30), row, 0, max_steps)
    run(episode.start())
    return episode


def outputs(observation: list[dict[str, Any]]) -> dict[str, Any]:
    """call_id -> the tool's reply, parsed."""
    return {item["call_id"]: json.loads(item["output"]) for item in observation}


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    """The launcher's fixture server that works (``POST /raw`` echoes the body it received)."""
    with Launcher(ready_timeout_s=60) as launcher:
        yield launcher.start(fixture_specs("launch")["fixture_ok"]).url


# ---- start, play, verify --------------------------------------------------------------------


def test_start_play_and_verify_through_a_bundled_server(launched):
    row = example_rows(WEATHER)[0]
    episode = Episode(ResourcesClient(launched[WEATHER]), row, 0, max_steps=8)
    assert episode.done  # not started yet
    observation, info = run(episode.start())
    assert observation == input_items(row)
    assert info == {"task_index": 0, "tools": row["responses_create_params"]["tools"], "sampling": {}}
    assert not episode.done and episode.turn == 0 and episode.trajectory == []

    player = scripted(WEATHER)
    call_turn = player(row, [])
    observation, reward, terminated, truncated, info = run(episode.play(call_turn))
    assert [item["type"] for item in observation] == ["function_call_output"]
    assert outputs(observation) == {call_turn[0]["call_id"]: {
        "city": "Winnipeg", "weather_description": "The weather in Winnipeg is cold."}}
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info == {"turn": 1, "num_tool_calls": 1}
    assert episode.trajectory == call_turn + observation

    final_turn = player(row, observation)
    observation, reward, terminated, truncated, info = run(episode.play(final_turn))
    assert (observation, reward, terminated, truncated) == ([], 1.0, True, False)
    # info holds the verify reply's numbers: the weather verifier counts the episode's calls.
    assert (info["reward"], info["turn"], info["num_tool_calls"]) == (1.0, 2, 1.0)
    assert episode.done and episode.error is None
    assert len(episode.trajectory) == 3  # the call, its output, the answer
    sent = episode.last_verify["response"]["output"]
    assert [(item["type"], item.get("call_id")) for item in sent] == [
        (item["type"], item.get("call_id")) for item in episode.trajectory]
    assert sent[-1]["content"][0]["text"] == final_turn[0]["content"][0]["text"]


def test_the_step_limit_verifies_and_truncates(launched):
    row = example_rows(WEATHER)[0]
    episode = started(launched[WEATHER], row, max_steps=1)
    _, reward, terminated, truncated, info = run(episode.play(scripted(WEATHER)(row, [])))
    assert (reward, terminated, truncated) == (1.0, False, True)  # verified, although no final answer
    assert episode.done and info["reward"] == 1.0


# ---- finish ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("correct", "reward"), [(True, 1.0), (False, 0.0)])
def test_finish_verifies_the_trajectory_so_far_and_truncates(launched, correct, reward):
    row = example_rows(COUNTER)[0]
    episode = started(launched[COUNTER], row)
    increments = scripted(COUNTER)(row, [], correct=correct)
    observation, step_reward, terminated, truncated, _ = run(episode.play(increments))
    assert (step_reward, terminated, truncated) == (0.0, False, False)
    so_far = list(episode.trajectory)

    observation, got, terminated, truncated, info = run(episode.finish())

    # The verifier scored the session as the increments left it: the counter is the server's.
    assert (observation, got, terminated, truncated) == ([], reward, False, True)
    assert info == {"turn": 1, "num_tool_calls": 0, "reward": reward,
                    "initial_count": row["initial_count"], "expected_count": row["expected_count"]}
    assert episode.done and episode.trajectory == so_far  # no model turn was made up
    sent = episode.last_verify["response"]["output"]
    assert [item["type"] for item in sent] == [item["type"] for item in so_far]
    assert [item.get("call_id") for item in sent] == [item.get("call_id") for item in so_far]
    assert all(item["type"] != "message" for item in sent)


def test_finish_right_after_start_verifies_an_empty_episode(launched):
    row = example_rows(WEATHER)[2]
    episode = started(launched[WEATHER], row)
    observation, reward, terminated, truncated, info = run(episode.finish())
    assert (observation, reward, terminated, truncated) == ([], 0.0, False, True)
    assert episode.last_verify["response"]["output"] == [] and info["turn"] == 0


def test_finish_on_an_ended_or_unstarted_episode_raises(launched):
    unstarted = Episode(ResourcesClient(launched[WEATHER]), example_rows(WEATHER)[0], 0, max_steps=8)
    with pytest.raises(RuntimeError, match="never started"):
        run(unstarted.finish())
    assert unstarted.last_verify is None

    row = example_rows(WEATHER)[0]
    ended = started(launched[WEATHER], row)
    run(ended.play([assistant_message("No idea.")]))
    assert ended.done
    verified = ended.last_verify
    with pytest.raises(RuntimeError, match="has ended"):
        run(ended.finish())
    assert ended.last_verify is verified  # nothing was sent again

    finished = started(launched[WEATHER], row)
    run(finished.finish())
    with pytest.raises(RuntimeError, match="has ended"):
        run(finished.finish())


# ---- tool arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        '{"zeta": 1, "alpha": 2, "mid": 3}',
        '{\n  "b" :  [1, 2 ,3],\t"a": {"y": null, "x": true}\n}',
        '  {"city":"Quito"}  ',
        '{"text": "caf\\u00e9", "raw": "café 😀"}',
        '{"n": 1.50, "m": 1E2, "k": -0}',
        "[3, 2, 1]",
        '"just a string"',
    ],
)
def test_tool_arguments_reach_the_server_exactly_as_written(echo_url, arguments):
    episode = started(echo_url, {"responses_create_params": {"input": "echo"}})
    observation, *_ = run(episode.play([function_call(0, 0, "raw", arguments)]))
    assert outputs(observation)["call_t0_0"] == {"raw": arguments}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def test_any_json_text_reaches_the_server_unchanged(echo_url):
    episode = started(echo_url, {"responses_create_params": {"input": "echo"}}, max_steps=10**6)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(value=JSON_VALUES, indent=st.sampled_from([None, 0, 1, 4]),
           separators=st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")]), ascii_only=st.booleans())
    def check(value: Any, indent: int | None, separators: tuple[str, str], ascii_only: bool) -> None:
        arguments = json.dumps(value, indent=indent, separators=separators, ensure_ascii=ascii_only)
        call = function_call(episode.turn, 0, "raw", arguments)
        observation, reward, terminated, truncated, _ = run(episode.play([call]))
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert json.loads(observation[0]["output"]) == {"raw": arguments}

    check()


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ("{not json", "Expecting property name"),
        ('{"count": 1', "Expecting ','"),
        ("", "Expecting value"),
        ('{"count": NaN}', "NaN is not a JSON value"),
        ('{"count": Infinity}', "Infinity is not a JSON value"),
        ('{"count": -Infinity}', "-Infinity is not a JSON value"),
        ("[1, NaN]", "NaN is not a JSON value"),
    ],
)
def test_arguments_that_are_not_json_give_an_error_output_and_are_not_sent(launched, arguments, reason):
    row = example_rows(COUNTER)[0]
    episode = started(launched[COUNTER], row)
    bad = function_call(0, 0, "increment_counter", arguments)
    read = function_call(0, 1, "get_counter_value", "{}")
    observation, reward, terminated, truncated, info = run(episode.play([bad, read]))
    replies = outputs(observation)
    error = replies["call_t0_0"]["error"]
    assert error.startswith("Invalid tool call arguments: ") and reason in error
    assert replies["call_t0_1"] == {"count": row["initial_count"]}  # the bad call never reached the server
    assert (reward, terminated, truncated) == (0.0, False, False) and info["num_tool_calls"] == 2
    assert not episode.done and episode.error is None
