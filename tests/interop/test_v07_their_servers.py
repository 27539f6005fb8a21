"""NeMo Gym 0.7.0's own servers behind our Env: the rewards their own agent would give.

Each server runs from the 0.7 venv on its own (``tests/interop/ng07.py``), and our Env plays
its shipped ``data/example.jsonl`` with scripted right and wrong play from each row's ground
truth: the ordinary resources servers mcqa, math_advanced_calculations, circle_count and
example_tool_call_multireward (``/seed_session``, tools, ``/verify``, then 0.7's
``/close_session``), and the Gymnasium-protocol servers blackjack and
example_multi_turn_gymnasium (``/reset``, ``/step``), whose step rewards their
``gymnasium_agent`` sums, as our verdict does. wordle is left out: its word list is not in
the wheel (its ``/reset`` answers 500 offline).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from nemo_gym_env import NemoGymEnv
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs import traits as envs_traits
from nemo_gym_env.protocol.scripting import assistant_message, function_call

from .ng07 import ng07_python, their_rows, their_server

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(1800)]  # the first test may build the 0.7 venv (~10 min)


@pytest.fixture(scope="module")
def python() -> Path:
    return ng07_python()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ng07")


def env_of(url: str, rows: list[dict[str, Any]], **kwargs: Any) -> NemoGymEnv:
    return NemoGymEnv(base_url=url, dataset=rows, **kwargs)


def play(env: NemoGymEnv, index: int, turns: list[Any]) -> tuple[list[float], bool, bool, dict[str, Any]]:
    env.reset(options={"task_index": index})
    rewards = []
    for action in turns:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return rewards, terminated, truncated, info
    raise AssertionError("the episode did not end")


# ---- ordinary resources servers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def mcqa(python, workdir) -> Iterator[str]:
    with their_server(python, "mcqa", workdir, domain="knowledge") as url:
        yield url


def test_mcqa_right_and_wrong_letters(python, mcqa):
    rows = their_rows(python, "mcqa")
    # What this process was told of an earlier server on the same (freed, taken again) port is forgotten.
    envs_traits._KNOWN.pop(mcqa, None)
    for _ in range(5):  # a server too busy to answer the probes is taken as unreachable, and asked again
        found = background_loop().run(envs_traits.server_traits(ResourcesClient(mcqa)), timeout=60)
        if found.found_by != "unreachable":
            break
        time.sleep(2)
    assert (found.protocol, found.close_session) == ("resources", True), found  # 0.7's /close_session
    env = env_of(mcqa, rows)
    try:
        for index, row in enumerate(rows):
            letters = [next(iter(option)) for option in row["options"]]
            wrong = next(letter for letter in letters if letter != row["expected_answer"])
            assert play(env, index, [f"So: \\boxed{{{row['expected_answer']}}}"])[0] == [1.0]
            rewards, terminated, truncated, info = play(env, index, [f"\\boxed{{{wrong}}}"])
            assert (rewards, terminated, truncated) == ([0.0], True, False)
            assert env.unwrapped.last_verify["extracted_answer"] == wrong and "error" not in info
    finally:
        env.close()


def test_math_advanced_calculations_right_tool_calls_and_wrong_text(python, workdir):
    rows = their_rows(python, "math_advanced_calculations")
    with their_server(python, "math_advanced_calculations", workdir, domain="math") as url:
        env = env_of(url, rows)
        try:
            for index, row in enumerate(rows):
                values = json.loads(row["ground_truth"])
                calls = [function_call(0, i, "return_constant", {"a": v}) for i, v in enumerate(values)]
                rewards, terminated, _, _ = play(env, index, [calls, [assistant_message("Done.")]])
                assert (rewards[-1], terminated) == (1.0, True), (index, env.unwrapped.last_verify.get("reward"))
                text = ", ".join(str(v) for v in values)
                assert play(env, index, [[assistant_message(text)]])[0] == [0.0]
        finally:
            env.close()


def test_circle_count_right_and_wrong_counts(python, workdir):
    rows = their_rows(python, "circle_count")
    with their_server(python, "circle_count", workdir) as url:
        env = env_of(url, rows)
        try:
            for index, row in enumerate(rows):
                count = sum(1 for circle in row["circles"] if circle["color"] == row["target_color"])
                assert play(env, index, [f"\\boxed{{{count}}}"])[0] == [1.0]
                assert play(env, index, [f"\\boxed{{{count + 1}}}"])[0] == [0.0]
        finally:
            env.close()


def test_example_tool_call_multireward_components_pass_through(python, workdir):
    rows = their_rows(python, "example_tool_call_multireward")
    with their_server(python, "example_tool_call_multireward", workdir) as url:
        env = env_of(url, rows)
        try:
            for index, row in enumerate(rows):
                call = function_call(0, 0, row["expected_call"]["name"], row["expected_call"]["arguments"])
                rewards, _, _, info = play(env, index, [[call], [assistant_message("Here it is.")]])
                # as with their simple_agent, the episode ends on a message: "format" is 0, the sum 2.0
                assert rewards[-1] == 2.0
                assert info["reward_components"] == {"correctness": 1.0, "schema_valid": 1.0, "format": 0.0}
                rewards, _, _, info = play(env, index, [[assistant_message("It is sunny.")]])
                assert rewards == [0.0] and info["reward_components"]["correctness"] == 0.0
        finally:
            env.close()


# ---- Gymnasium-protocol servers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def blackjack(python, workdir) -> Iterator[str]:
    with their_server(python, "blackjack", workdir, domain="games") as url:
        yield url


OUTCOME = {"win": 1.0, "draw": 0.0, "loss": -1.0, "bust": -1.0}


def test_blackjack_is_told_to_be_a_gymnasium_protocol_server(blackjack):
    envs_traits._KNOWN.pop(blackjack, None)
    found = background_loop().run(envs_traits.server_traits(ResourcesClient(blackjack)), timeout=60)
    assert (found.protocol, found.found_by) == ("gymnasium", "routes")


@pytest.mark.parametrize("hits", [0, 1, 2])
def test_blackjack_rewards_are_the_outcome_its_agent_would_sum(python, blackjack, hits):
    rows = their_rows(python, "blackjack")
    env = env_of(blackjack, rows, max_steps=5)
    try:
        for _ in range(4):  # the deal is random: play several hands
            obs, _ = env.reset(options={"task_index": 0})
            assert obs[-1]["role"] == "user" and obs[-1]["content"].startswith("Your hand:")
            rewards = []
            for turn in range(hits + 1):
                action = "<action>hit</action>" if turn < hits else "<action>stand</action>"
                _, reward, terminated, truncated, info = env.step(action)
                rewards.append(reward)
                if terminated or truncated:
                    break
            assert terminated and not truncated
            assert rewards[:-1] == [0.0] * (len(rewards) - 1)  # blackjack rewards only the last step
            assert rewards[-1] == OUTCOME[info["result"]]
            assert env.unwrapped.last_verify["reward"] == sum(rewards)
    finally:
        env.close()


def test_make_vec_plays_their_blackjack(python, blackjack):
    envs = gym.make_vec("NemoGym/Generic-v0", num_envs=2, base_url=blackjack,
                        dataset=their_rows(python, "blackjack"))
    try:
        obs, _ = envs.reset(seed=0)
        assert all(o[-1]["content"].startswith("Your hand:") for o in obs)
        _, rewards, terminations, truncations, infos = envs.step(["<action>stand</action>"] * 2)
        assert terminations.all() and not truncations.any()
        assert set(rewards.tolist()) <= {-1.0, 0.0, 1.0}
    finally:
        envs.close()


def test_example_multi_turn_gymnasium_right_and_wrong(python, workdir):
    rows = their_rows(python, "example_multi_turn_gymnasium")
    with their_server(python, "example_multi_turn_gymnasium", workdir) as url:
        env = env_of(url, rows, max_steps=5)
        try:
            for index, row in enumerate(rows):
                follow_ups = row["follow_ups"]
                turns = ["Noted."] * len(follow_ups)
                rewards, terminated, truncated, _ = play(env, index, [*turns, f"It is {row['expected_answer']}."])
                assert (rewards, terminated, truncated) == ([0.0] * len(follow_ups) + [1.0], True, False)
                rewards, terminated, _, _ = play(env, index, [*turns, "I do not know."])
                assert (sum(rewards), terminated) == (0.0, True)
        finally:
            env.close()
