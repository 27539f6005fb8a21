"""End-to-end tests of NemoGymEnv against real server processes on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import nemo_gym_env
from nemo_gym_env import ActionError, NemoGymEnv, ServerError
from nemo_gym_env.protocol.types import make_response

from ..conftest import BUNDLED, JUDGED, example_rows, play_episode, scripted

pytestmark = pytest.mark.slow

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Quito"}}</tool_call>'


@pytest.fixture
def weather(launched):
    env = NemoGymEnv(base_url=launched["example_single_tool_call"], dataset=example_rows("example_single_tool_call"))
    yield env
    env.close()


@pytest.mark.parametrize("server", BUNDLED)
def test_check_env_passes_on_every_registered_id(server):
    env = gym.make(nemo_gym_env.env_id(server))
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_code_gen_differs_between_runs_only_in_its_timing():
    """code_gen's id is flagged nondeterministic (wall-clock limits), so check_env skips its
    step-determinism check; everything but the measured time must still repeat exactly."""
    assert gym.spec(nemo_gym_env.env_id("code_gen")).nondeterministic
    assert not gym.spec(nemo_gym_env.env_id("math")).nondeterministic
    env = gym.make(nemo_gym_env.env_id("code_gen"))
    try:
        results = []
        for action in (scripted("code_gen")(env.unwrapped.rows[0], [], correct=True), "no code here"):
            for _ in range(2):
                obs, _ = env.reset(seed=7, options={"task_index": 0})
                obs, reward, terminated, truncated, info = env.step(action)
                assert isinstance(info.pop("unit_tests_time_taken"), float)
                results.append((obs, reward, terminated, truncated, info))
        assert results[0] == results[1] and results[2] == results[3]
        assert results[0][1] == 1.0 and results[2][1] == 0.0
    finally:
        env.close()


@pytest.mark.parametrize("server", JUDGED)
def test_scripted_play_gets_reward_one_and_zero_on_every_task(server):
    env = gym.make(nemo_gym_env.env_id(server))
    try:
        for index in range(len(env.unwrapped.rows)):
            reward, terminated, truncated, info = play_episode(env, server, correct=True, options={"task_index": index})
            assert (reward, terminated, truncated) == (1.0, True, False), info
            assert env.unwrapped.last_verify["reward"] == 1.0
            reward, terminated, truncated, info = play_episode(env, server, correct=False, options={"task_index": index})
            assert (reward, terminated, truncated) == (0.0, True, False), info
    finally:
        env.close()


def test_raw_text_with_think_and_tool_call(weather):
    weather.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = weather.step("<think>Need the weather.</think>\n" + CALL)
    assert [o["type"] for o in obs] == ["function_call_output"]
    assert json.loads(obs[0]["output"]) == {"city": "Quito", "weather_description": "The weather in Quito is cold."}
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, info = weather.step("It is cold in Quito.")
    assert (obs, reward, terminated, truncated) == ([], 1.0, True, False)
    types = [item["type"] for item in weather.response.model_dump()["output"]]
    assert types == ["reasoning", "function_call", "function_call_output", "message"]
    assert weather.last_verify["response"]["output"][1]["name"] == "get_weather"


def test_response_object_and_sdk_items_as_actions(weather):
    weather.reset(seed=1)
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Lima"}'}
    obs, *_ = weather.step(make_response([call]))
    assert obs[0]["call_id"] == "c1"
    final = make_response([{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": "Cold."}]}]).output
    obs, reward, terminated, _, _ = weather.step(final)
    assert (reward, terminated) == (1.0, True)


def test_no_tool_call_gives_reward_zero_on_weather(weather):
    weather.reset(seed=0)
    _, reward, terminated, truncated, info = weather.step("I do not know.")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["reward"] == 0.0


def test_same_seed_same_task(weather):
    _, first = weather.reset(seed=123)
    _, second = weather.reset(seed=123)
    assert first["task_index"] == second["task_index"]
    seen = {weather.reset(seed=s)[1]["task_index"] for s in range(40)}
    assert len(seen) > 1


def test_task_index_and_row_options(weather):
    obs, info = weather.reset(options={"task_index": 3})
    assert info["task_index"] == 3 and obs == weather.unwrapped.task["responses_create_params"]["input"]
    row = {"responses_create_params": {"input": "weather in Bern?", "tools": weather.rows[0]["responses_create_params"]["tools"]}}
    obs, info = weather.reset(options={"row": row})
    assert obs == [{"role": "user", "content": "weather in Bern?", "type": "message"}]
    with pytest.raises(ValueError, match="task_index"):
        weather.reset(options={"task_index": 99})
    with pytest.raises(ValueError, match="responses_create_params"):
        weather.reset(options={"row": {"prompt": "x"}})


@pytest.mark.parametrize("bad", [42, None, {"foo": 1}, [{"type": "function_call_output", "call_id": "x", "output": ""}],
                                 [{"type": "message", "role": "user", "content": "hi"}], [3],
                                 [{"type": "function_call", "name": "get_weather"}]])
def test_bad_action_raises_and_loses_nothing(weather, bad):
    weather.reset(seed=0)
    with pytest.raises(ActionError):
        weather.step(bad)
    assert weather.episode.turn == 0 and weather.episode.trajectory == []
    _, _, _, _, info = weather.step(CALL)
    assert info["num_tool_calls"] == 1


def test_step_after_end_needs_reset(weather):
    weather.reset(seed=0)
    weather.step("bye")
    with pytest.raises(gym.error.ResetNeeded):
        weather.step("again")


def test_invalid_arguments_unknown_and_reserved_tools_become_error_outputs(weather):
    weather.reset(seed=0)
    items = [
        {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{not json"},
        {"type": "function_call", "call_id": "b", "name": "no_such_tool", "arguments": "{}"},
        {"type": "function_call", "call_id": "c", "name": "verify", "arguments": "{}"},
        {"type": "function_call", "call_id": "d", "name": "../seed_session", "arguments": "{}"},
        {"type": "function_call", "call_id": "e", "name": "get_weather", "arguments": '{"city": 5}'},
    ]
    obs, reward, terminated, truncated, _ = weather.step(items)
    outputs = {o["call_id"]: o["output"] for o in obs}
    assert json.loads(outputs["a"])["error"].startswith("Invalid tool call arguments")
    assert "Not Found" in outputs["b"]
    assert "Unknown tool" in outputs["c"] and "Unknown tool" in outputs["d"]
    assert "get_weather" in json.loads(outputs["e"])["error"]
    assert not terminated and not truncated


def test_step_limit_verifies_and_truncates(launched):
    env = NemoGymEnv(base_url=launched["example_single_tool_call"], dataset=example_rows("example_single_tool_call"),
                     max_steps=2)
    env.reset(seed=0)
    assert env.step(CALL)[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step(CALL)
    assert (terminated, truncated) == (False, True)
    assert reward == 1.0 and env.last_verify is not None  # verified although truncated
    env.close()


def test_async_api(weather):
    async def episode():
        await weather.areset(seed=0)
        await weather.astep(CALL)
        return await weather.astep("done")

    _, reward, terminated, _, _ = asyncio.run(episode())
    assert (reward, terminated) == (1.0, True)


def test_generic_id_with_base_url(launched):
    env = gym.make(nemo_gym_env.GENERIC_ID, base_url=launched["example_multi_step"],
                   dataset=example_rows("example_multi_step"))
    reward, *_ = play_episode(env, "example_multi_step", correct=True, seed=0)
    assert reward == 1.0
    env.close()
    env.close()  # twice is fine


def test_base_url_without_dataset_is_a_clear_error(launched):
    with pytest.raises(ValueError, match="dataset is required"):
        NemoGymEnv(base_url=launched["example_multi_step"])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_server_down_at_reset_names_server_and_route():
    env = NemoGymEnv(base_url=f"http://127.0.0.1:{_closed_port()}", dataset=example_rows("example_single_tool_call"))
    with pytest.raises(ServerError, match=r"/seed_session \(task \d\).*cannot connect"):
        env.reset(seed=0)
    env.close()


def test_server_killed_mid_episode_truncates_with_error():
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher() as launcher:
        process = launcher.start(bundled_spec("example_session_state_mgmt"))
        env = NemoGymEnv(base_url=process.url, dataset=example_rows("example_session_state_mgmt"),
                         request_timeout_s=5)
        env.reset(seed=0)
        os.killpg(process.pid, signal.SIGKILL)
        time.sleep(0.3)
        started = time.monotonic()
        obs, reward, terminated, truncated, info = env.step(
            [{"type": "function_call", "call_id": "x", "name": "increment_counter", "arguments": '{"count": 1}'}])
        assert time.monotonic() - started < 30
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert "/increment_counter" in info["error"] and "task" in info["error"]
        assert info["route"] == "/increment_counter"
        raising = NemoGymEnv(base_url=process.url, dataset=example_rows("example_session_state_mgmt"),
                             on_server_error="raise")
        with pytest.raises(ServerError):
            raising.reset(seed=0)
        env.close()
        raising.close()


def test_embedded_server_is_shared_and_stopped_with_last_env():
    from nemo_gym_env import launch

    first = gym.make("NemoGym/example_single_tool_call-v0")
    second = gym.make("NemoGym/example_single_tool_call-v0")
    assert first.unwrapped.base_url == second.unwrapped.base_url
    url = first.unwrapped.base_url
    first.close()
    assert second.unwrapped.client and asyncio.run(_health(url))
    second.close()
    deadline = time.monotonic() + 10
    while asyncio.run(_health(url)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not asyncio.run(_health(url))
    assert "example_single_tool_call" not in launch.shared_servers()


async def _health(url: str) -> bool:
    import httpx

    try:
        async with httpx.AsyncClient() as client:
            return (await client.get(url + "/", timeout=1)).status_code == 200
    except httpx.HTTPError:
        return False


def test_render_ansi(launched):
    env = NemoGymEnv(base_url=launched["example_single_tool_call"], dataset=example_rows("example_single_tool_call"),
                     render_mode="ansi")
    env.reset(seed=0)
    env.step(CALL)
    text = env.render()
    assert "get_weather" in text and "tool output" in text
    env.close()
