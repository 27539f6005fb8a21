"""Gymnasium-protocol episodes (``envs.gymnasium_episode``) behind the env, against real server
processes on 127.0.0.1: ``/reset`` and ``/step`` as NeMo Gym's ``gymnasium_agent`` sends them,
the server's per-step rewards, the verdict row, the step limit, and ``/step`` replies that are
not steps (each ends the episode truncated with ``info["error"]``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

from nemo_gym_env import NemoGymEnv, ServerError
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.scripting import assistant_message

from ..fixtures import fixture_specs

pytestmark = pytest.mark.slow

SYSTEM = {"role": "system", "content": "Play."}


def row(**fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": [SYSTEM, {"role": "user", "content": "Go."}]}, **fields}


def step(reward: Any = 0.0, terminated: Any = False, truncated: Any = False, observation: Any = None,
         **info: Any) -> dict[str, Any]:
    return {"observation": observation, "reward": reward, "terminated": terminated, "truncated": truncated,
            "info": info}


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    with Launcher(ready_timeout_s=60) as launcher:
        yield {p.name: p.url for p in launcher.start_all(fixture_specs("protocols").values())}


@pytest.fixture
def scripted(urls) -> Iterator[callable]:
    envs = []

    def make(*rows: dict[str, Any], **kwargs: Any) -> NemoGymEnv:
        env = NemoGymEnv(base_url=urls["proto_scripted_steps"], dataset=list(rows), **kwargs)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def log(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/_log", timeout=10).json()


def test_reset_shows_the_rows_input_then_the_servers_observation(scripted, urls):
    env = scripted(row(first="Your hand: 7.", replies=[step(1.0, True)]))
    obs, info = env.reset()
    assert obs[:2] == [SYSTEM, {"role": "user", "content": "Go."}]  # the row's input items, as written
    assert obs[2] == {"type": "message", "role": "user", "content": "Your hand: 7."}
    sent = log(urls["proto_scripted_steps"])[-1]
    assert sent["route"] == "/reset" and sent["body"]["first"] == "Your hand: 7."  # the whole row


def test_a_null_first_observation_leaves_the_rows_input_alone(scripted):
    env = scripted(row(replies=[step(1.0, True)]))
    obs, _ = env.reset()
    assert len(obs) == 2


def test_per_step_rewards_arrive_as_the_server_sends_them_and_the_verdict_sums_them(scripted, urls):
    env = scripted(row(first="start", replies=[step(0.5, observation="Hand 2."), step(-0.25, observation="Hand 3."),
                                                step(1.0, True, result="win")]))
    env.reset()
    rewards, observations = [], []
    for text in ("<action>hit</action>", "<action>hit</action>", "<action>stand</action>"):
        obs, reward, terminated, truncated, info = env.step(text)
        rewards.append(reward)
        observations.append(obs)
    assert rewards == [0.5, -0.25, 1.0]
    assert (terminated, truncated) == (True, False)
    assert observations[0] == [{"type": "message", "role": "user", "content": "Hand 2."}]
    assert observations[2] == []  # the terminal step's observation is not shown, as in NeMo Gym's agent
    assert info["result"] == "win" and info["reward"] == pytest.approx(1.25)
    verdict = env.unwrapped.last_verify
    assert verdict["reward"] == pytest.approx(1.25) and verdict["terminated"] and not verdict["truncated"]
    assert verdict["info"] == {"result": "win"}
    assert [m["content"] for m in verdict["responses_create_params"]["input"]] == ["Play.", "Go.", "start"]
    # each /step carries the row and this turn only, as a Response
    steps = [entry["body"] for entry in log(urls["proto_scripted_steps"]) if entry["route"] == "/step"][-3:]
    assert [s["first"] for s in steps] == ["start"] * 3
    texts = [[part["text"] for item in s["response"]["output"] for part in item["content"]] for s in steps]
    assert texts == [["<action>hit</action>"], ["<action>hit</action>"], ["<action>stand</action>"]]


def test_tool_outputs_in_info_come_back_as_function_call_outputs(scripted):
    reply = step(observation="Guess again.", tool_outputs=[{"call_id": "c1", "output": '{"feedback": "G_Y__"}'}])
    env = scripted(row(replies=[reply, step(2.0, True)]))
    env.reset()
    call = {"type": "function_call", "call_id": "c1", "name": "submit_guess", "arguments": '{"guess": "chump"}'}
    obs, reward, terminated, _, _ = env.step([call])
    assert obs == [{"type": "function_call_output", "call_id": "c1", "output": '{"feedback": "G_Y__"}'},
                   {"type": "message", "role": "user", "content": "Guess again."}]
    assert (reward, terminated) == (0.0, False)


def test_max_steps_truncates_and_the_verdict_sums_what_came(scripted):
    env = scripted(row(replies=[step(0.5, observation="more")] * 5), max_steps=2)
    env.reset()
    assert env.step("a")[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step("b")
    assert (reward, terminated, truncated) == (0.5, False, True)
    assert env.unwrapped.last_verify["reward"] == 1.0 and env.unwrapped.last_verify["truncated"]


@pytest.mark.parametrize("reply, why", [
    (step(reward="lots"), "reward that is not a finite number"),
    (step(reward=None), "reward that is not a finite number"),
    (step(reward=True), "reward that is not a finite number"),
    ({"observation": None, "reward": 1.0, "info": {}}, "lacks terminated and truncated"),
    ({"observation": None, "reward": 1.0, "terminated": True, "info": {}}, "lacks truncated"),
    (step(terminated="yes"), "not booleans"),
    (step(observation=["not", "text"]), "observation that is not text"),
    ({**step(), "info": "oops"}, "info that is not a JSON object"),
    (["not", "an", "object"], "is not a JSON object"),
])
def test_a_reply_that_is_not_a_step_ends_the_episode_truncated_with_an_error(scripted, reply, why):
    env = scripted(row(replies=[step(0.5, observation="ok"), reply]))
    env.reset()
    assert env.step("one")[1] == 0.5
    obs, reward, terminated, truncated, info = env.step("two")
    assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
    assert why in info["error"] and info["route"] == "/step"
    with pytest.raises(gym.error.ResetNeeded):
        env.step("three")
    env.reset()  # the env is still usable


def test_on_server_error_raise_raises_the_bad_step(scripted):
    env = scripted(row(replies=[step(reward="lots")]), on_server_error="raise")
    env.reset()
    with pytest.raises(ServerError, match="not a finite number"):
        env.step("x")


def test_a_failing_reset_is_a_server_error(urls):
    env = NemoGymEnv(base_url=urls["proto_countdown"], dataset=[{"responses_create_params": {"input": "x"},
                                                                 "start": "many"}])
    try:
        with pytest.raises(ServerError, match="/reset"):
            env.reset()
    finally:
        env.close()


def test_check_env_passes_on_a_gymnasium_protocol_server(urls):
    env = NemoGymEnv(base_url=urls["proto_countdown"], dataset=[row(start=2), row(start=3)])
    try:
        check_env(env, skip_render_check=True)
        obs, _ = env.reset(options={"task_index": 0})
        assert obs[-1]["content"] == "Count down from 2."
        assert env.step([assistant_message("1")])[1:4] == (0.25, False, False)
        assert env.step("0")[1:4] == (1.0, True, False)
        assert env.unwrapped.last_verify["reward"] == 1.25
    finally:
        env.close()
