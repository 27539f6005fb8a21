"""Step rewards and reward components through the env, the vector env and rollout rows, on real processes.

The ``rewards`` fixture server (``tests/fixtures/servers/rewards``) gives step rewards and
components exactly as a test asks, well-formed or not; ``example_multi_step`` gives its step
rewards and ``instruction_following`` its components as the bundled servers do.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from gymnasium.vector import AutoresetMode

from nemo_gym_env.envs.env import NemoGymEnv
from nemo_gym_env.envs.vector import NemoGymVectorEnv
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.policies.scripted import ScriptedPolicy
from nemo_gym_env.rollouts.jobs import collect
from nemo_gym_env.rollouts.report import metrics_table, outcome_of, summarize_outcomes

from ..conftest import example_rows
from ..fixtures import fixture_specs

TOOLS = [{"type": "function", "name": "score", "parameters": {"type": "object", "properties": {}}, "strict": False}]


def _row(**fields) -> dict:
    return {"responses_create_params": {"input": "hi", "tools": TOOLS}, **fields}


def _call(header, say: str = "x") -> str:
    return f'<tool_call>{{"name": "score", "arguments": {json.dumps({"header": header, "say": say})}}}</tool_call>'


@pytest.fixture(scope="module")
def servers():
    with Launcher() as launcher:
        processes = launcher.start_all([fixture_specs("rewards")["rewards"], bundled_spec("instruction_following")])
        yield {p.name: p.url for p in processes}


@pytest.fixture(scope="module")
def rewards_url(servers) -> str:
    return servers["rewards"]


def test_step_rewards_are_gymnasium_rewards_and_the_tool_output_is_unchanged(rewards_url):
    env = NemoGymEnv(base_url=rewards_url, dataset=[_row(reward=1.0)])
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(_call("0.25", say="hello"))
    assert obs[0]["output"] == '{"said":"hello"}'  # what the model reads: the body, no trace of the header
    assert (reward, terminated, truncated, info["step_reward"]) == (0.25, False, False, 0.25)
    obs, reward, *_ = env.step(_call(None))
    assert reward == 0.0  # a turn whose tools gave none
    obs, reward, terminated, truncated, info = env.step("done")
    assert (reward, terminated) == (1.0, True)  # the last step: /verify's reward (plus this turn's step reward, 0)
    assert info["reward"] == 1.0  # the episode's reward stays /verify's
    assert info["step_rewards"] == [0.25, 0.0, 0.0] and info["step_reward_sum"] == 0.25
    verdict = env.unwrapped.episode.verdict()
    assert verdict["reward"] == 1.0 and verdict["step_rewards"] == [0.25, 0.0, 0.0]
    env.close()


def test_episode_reward_sum_adds_the_step_rewards(rewards_url):
    env = NemoGymEnv(base_url=rewards_url, dataset=[_row(reward=0.5)], episode_reward="sum", max_steps=2)
    env.reset(seed=0)
    assert env.step(_call("0.25"))[1] == 0.25
    obs, reward, terminated, truncated, info = env.step(_call("-1"))  # the step limit: verified, truncated
    assert (terminated, truncated) == (False, True)
    assert reward == 0.5 - 1.0  # /verify's reward and this turn's step reward
    assert info["reward"] == pytest.approx(-0.25) and info["verify_reward"] == 0.5
    assert env.unwrapped.episode.verdict()["reward"] == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="episode_reward"):
        NemoGymEnv(base_url=rewards_url, dataset=[_row()], episode_reward="mean")
    env.close()


def test_no_step_rewards_leaves_info_and_rows_as_they_were(rewards_url):
    env = NemoGymEnv(base_url=rewards_url, dataset=[_row()])
    env.reset(seed=0)
    info = env.step(_call(None))[4]
    assert "step_reward" not in info
    info = env.step("done")[4]
    assert not {"step_reward", "step_rewards", "step_reward_sum"} & set(info)
    assert "step_rewards" not in env.unwrapped.episode.verdict()
    env.close()


@pytest.mark.parametrize(("header", "why"), [
    ("lots", "'lots' is not a number"),
    ("nan", "not a finite number"),
    (["0.5", "1"], "2 x-nemo-gym-step-reward headers"),
])
def test_a_bad_step_reward_ends_the_episode_truncated(rewards_url, header, why):
    env = NemoGymEnv(base_url=rewards_url, dataset=[_row()])
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(_call(header))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert why in info["error"] and info["route"] == "/score"
    env.close()


def test_a_step_reward_on_verify_is_refused(rewards_url):
    env = NemoGymEnv(base_url=rewards_url, dataset=[_row(verify_header="1")])
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("done")
    assert (reward, truncated) == (0.0, True)
    assert "on /verify, the route that ends the episode" in info["error"]
    env.close()


@pytest.mark.parametrize(("components", "why"), [
    ({"a": "x"}, "reward component 'a' is 'x', not a finite number"),
    ({"a": True}, "not a finite number"),
    ([1, 2], "'reward_components' must map names to numbers"),
])
def test_a_component_that_is_not_a_number_ends_the_episode_truncated(rewards_url, components, why):
    env = NemoGymEnv(base_url=rewards_url, dataset=[_row(components=components)], on_server_error="truncate")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("done")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert why in info["error"]
    env.close()


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED])
def test_vector_infos_carry_each_sub_envs_components_in_every_autoreset_mode(rewards_url, mode):
    rows = [_row(reward=1.0, components={"a": 0.25, "b": 0.75}), _row(reward=2.0, components={"a": 2.0})]
    envs = NemoGymVectorEnv(num_envs=2, base_url=rewards_url, dataset=rows, autoreset_mode=mode)
    envs.reset(seed=0, options={"task_indices": [0, 1]})
    obs, rewards, terms, truncs, infos = envs.step([_call("0.5"), "done"])
    assert rewards.tolist() == [0.5, 2.0]
    ended = infos["final_info"] if mode == AutoresetMode.SAME_STEP else infos
    parts = ended["reward_components"]
    assert parts["_a"].tolist() == [False, True] and parts["a"][1] == 2.0
    assert "b" not in parts  # no ended sub-env has it yet
    assert infos["step_reward"][0] == 0.5 and infos["_step_reward"].tolist() == [True, False]
    actions = ["done", None] if mode != AutoresetMode.SAME_STEP else ["done", "done"]
    obs, rewards, terms, truncs, infos = envs.step(actions)
    ended = infos["final_info"] if mode == AutoresetMode.SAME_STEP else infos
    assert rewards[0] == 1.0 and terms[0]
    assert ended["reward_components"]["a"][0] == 0.25 and ended["reward_components"]["b"][0] == 0.75
    assert ended["step_rewards"][0] == [0.5, 0.0] and ended["step_reward_sum"][0] == 0.5
    envs.close()


def test_example_multi_step_gives_a_step_reward_per_new_lookup():
    env = NemoGymEnv("example_multi_step", episode_reward="sum")
    try:
        env.reset(options={"task_index": 0})
        row = env.unwrapped.task
        lookups = [*row["expected_synonyms"], row["expected_synonyms"][0]]  # the last one is a repeat
        rewards = []
        for synonym in lookups:
            call = {"name": "get_synonym_value", "arguments": {"synonym": synonym}}
            rewards.append(env.step(f"<tool_call>{json.dumps(call)}</tool_call>")[1])
        assert rewards == [0.1] * len(row["expected_synonyms"]) + [0.0]
        answer = {"name": "extract_synonym_values", "arguments": {"synonym_values": row["expected_synonym_values"]}}
        env.step(f"<tool_call>{json.dumps(answer)}</tool_call>")
        obs, reward, terminated, truncated, info = env.step("Done.")
        assert terminated and info["verify_reward"] == 1.0
        assert info["reward"] == pytest.approx(1.0 + 0.1 * len(row["expected_synonyms"]))
    finally:
        env.close()


def _fraction_rows() -> list[dict]:
    return [{**row, "grading_mode": "fraction"} for row in example_rows("instruction_following")]


def test_instruction_following_components_sum_to_the_fraction_reward(servers):
    env = NemoGymEnv(base_url=servers["instruction_following"], dataset=_fraction_rows())
    env.reset(options={"task_index": 0})
    # 4 instructions: at least 40 words (no), no commas (yes), a <<title>> (yes), 2 SECTIONs (no).
    obs, reward, terminated, truncated, info = env.step("<<Blue>> The sky is blue")
    parts = info["reward_components"]
    assert parts == {"length_constraints:number_words": 0.0, "punctuation:no_comma": 0.25,
                     "detectable_format:title": 0.25, "detectable_format:multiple_sections": 0.0}
    assert reward == 0.5 == sum(parts.values())
    env.close()
    binary = NemoGymEnv(base_url=servers["instruction_following"], dataset=example_rows("instruction_following"))
    binary.reset(options={"task_index": 0})
    assert "reward_components" not in binary.step("<<Blue>> The sky is blue")[4]  # a binary reward has no parts
    binary.close()


def test_rollout_rows_and_metrics_carry_components_and_step_rewards(servers, launched):
    async def rows_of(rows, policy, url, **kwargs):
        return [row async for row in collect(rows, policy, url, **kwargs)]

    following = asyncio.run(rows_of(_fraction_rows(), ScriptedPolicy("instruction_following", correct=False),
                                     servers["instruction_following"], server_name="instruction_following"))
    multi = asyncio.run(rows_of(example_rows("example_multi_step")[:3], ScriptedPolicy("example_multi_step"),
                                launched["example_multi_step"], server_name="example_multi_step", num_repeats=2))
    for row in following:
        assert sum(row["reward_components"].values()) == pytest.approx(row["reward"])
    for row in multi:
        assert row["reward"] == 1.0  # the /verify reward stays the row's reward
        assert len(row["step_rewards"]) >= 2 and row["step_reward_sum"] == pytest.approx(sum(row["step_rewards"]))
        assert row["step_reward_sum"] > 0
    summary = summarize_outcomes("x.jsonl", [outcome_of(r) for r in following + multi], [])
    means = summary["per_server"]["instruction_following"]["reward_components"]
    for name, mean in means.items():
        having = [r["reward_components"][name] for r in following if name in r["reward_components"]]
        assert mean == pytest.approx(sum(having) / len(having))
    assert summary["per_server"]["example_multi_step"]["reward_components"] == {}
    assert summary["per_server"]["example_multi_step"]["agent_metrics"]["mean/step_reward_sum"] > 0
    table = metrics_table(summary)
    assert "reward component" in table and "punctuation:no_comma" in table
    summed = asyncio.run(rows_of(example_rows("example_multi_step")[:1], ScriptedPolicy("example_multi_step"),
                                 launched["example_multi_step"], episode_reward="sum"))
    assert summed[0]["verify_reward"] == 1.0
    assert summed[0]["reward"] == pytest.approx(1.0 + summed[0]["step_reward_sum"])
