"""Reward components and step rewards through the TRL ``rollout_func`` route, on a real server process.

The ``rewards`` fixture server gives the step rewards and components a row asks for; a scripted
``generate`` (as in ``test_rollout``) plays the model with SmolLM2's real tokenizer.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

import nemo_gym_env  # noqa: F401  (registers the ids)
from nemo_gym_env.adapters.trl import component_rewards, env_reward, nemo_gym_rollout_func, tasks_dataset
from nemo_gym_env.launch.launcher import Launcher

from ...fixtures import fixture_specs
from .test_rollout import END, Scripted

SCORE = {"type": "function", "name": "score", "description": "Score.",
         "parameters": {"type": "object", "properties": {"header": {"type": "string"}}, "required": ["header"],
                        "additionalProperties": False}, "strict": True}


def _row(n: int, **fields) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": f"Task {n}."}], "tools": [SCORE]},
            **fields}


def _call(header: str) -> str:
    return f'<tool_call>\n{json.dumps({"name": "score", "arguments": {"header": header}})}\n</tool_call>{END}'


@pytest.fixture(scope="module")
def rewards_url():
    with Launcher() as launcher:
        yield launcher.start(fixture_specs("rewards")["rewards"]).url


@pytest.mark.parametrize("episode_reward", ["verify", "sum"])
def test_components_and_step_rewards_reach_reward_functions(tokenizer, rewards_url, episode_reward):
    rows = [_row(0, reward=1.0, components={"a": 0.25, "b": 0.75}), _row(1, reward=2.0, components={"a": 2.0})]
    dataset = tasks_dataset(rows)
    prompts = [dataset[0]["prompt"], dataset[1]["prompt"]]
    generate = Scripted(tokenizer, [[_call("0.5"), f"done{END}"], [f"done{END}"]])
    with nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=rewards_url, dataset=rows, max_turns=3,
                               episode_reward=episode_reward) as rollout:
        out = rollout.rollout(prompts, generate, tokenizer=tokenizer, max_completion_length=256)
    assert out["env_error"] == [None, None]
    assert out["step_rewards"] == [[0.5, 0.0], [0.0]] and out["step_reward_sum"] == [0.5, 0.0]
    assert out["reward_components"] == [{"a": 0.25, "b": 0.75}, {"a": 2.0}]
    assert out["component_a"] == [0.25, 2.0] and out["component_b"] == [0.75, None]
    if episode_reward == "sum":
        assert out["env_reward"] == [1.5, 2.0] and out["verify_reward"] == [1.0, 2.0]
    else:
        assert out["env_reward"] == [1.0, 2.0] and "verify_reward" not in out

    # What TRL does with the columns: every extra field is a keyword argument of every reward function.
    kwargs = {k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs")}
    funcs = component_rewards(["a", "b"])
    assert [f.__name__ for f in funcs] == ["component_a", "component_b"]
    assert [f(["x", "y"], **kwargs) for f in funcs] == [[0.25, 2.0], [0.75, None]]
    assert env_reward(["x", "y"], **kwargs) == out["env_reward"]


def test_component_rewards_refuse_bad_names_and_values():
    with pytest.raises(ValueError, match="at least one"):
        component_rewards([])
    with pytest.raises(ValueError, match="repeat"):
        component_rewards(["a", "a"])
    with pytest.raises(ValueError, match="non-empty string"):
        component_rewards([""])
    [func] = component_rewards(["a"])
    with pytest.raises(ValueError, match="not a finite number"):
        func(["x"], env_reward=[1.0], component_a=["high"])
    with pytest.raises(ValueError, match="rollout_func"):
        func(["x"])  # not a rollout of ours: no columns at all
    assert func(["x", "y"], env_reward=[None, None]) == [None, None]  # every episode failed: nothing to score


def test_a_verifier_that_judged_nothing_is_no_reward_on_either_route(tokenizer, rewards_url):
    """A verify timeout or a masked verdict: None (unscorable, out of the loss and the baseline) on the
    rollout_func route and from get_reward() on the environment_factory route; a wrong answer stays 0.0."""
    from nemo_gym_env.adapters.trl import nemo_gym_environment

    rows = [_row(0, reward=0.0, failure_kind="verify_timeout", failure_reason="math-verify ran out of time"),
            _row(1, reward=0.0, mask_sample=True, failure_kind="judge_failed"),
            _row(2, reward=0.0, failure_kind="wrong_answer"),
            _row(3, reward=1.0)]
    dataset = tasks_dataset(rows)
    generate = Scripted(tokenizer, [[f"done{END}"]] * len(rows))
    with nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=rewards_url, dataset=rows, max_turns=2) as rollout:
        out = rollout.rollout([dataset[i]["prompt"] for i in range(len(rows))], generate, tokenizer=tokenizer,
                              max_completion_length=128)
    assert out["env_reward"] == [None, None, 0.0, 1.0]
    assert "verify_timeout" in out["env_error"][0] and "math-verify ran out of time" in out["env_error"][0]
    assert "judge_failed" in out["env_error"][1] and out["env_error"][2:] == [None, None]
    assert all(m == 0 for m in out["env_mask"][0] + out["env_mask"][1])  # nothing of them is trained on
    kwargs = {k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs")}
    assert env_reward(["a", "b", "c", "d"], **kwargs) == [None, None, 0.0, 1.0]

    Env = nemo_gym_environment("NemoGym/Generic-v0", base_url=rewards_url, dataset=rows)
    rewards = []
    for index in range(len(rows)):
        env = Env()
        env.reset(task=index)
        rewards.append(env.get_reward())
        env.close()
    assert rewards == [None, None, 0.0, 1.0]
