"""The result layout and its invariants (``nemo_gym_env.adapters.nemo_rl.results``), without NeMo RL."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from nemo_gym_env.adapters.nemo_rl import (
    NemoRLFormatError,
    check_nemo_rl_result,
    to_nemo_rl_result,
    token_turns,
)
from nemo_gym_env.policies import PolicyTurn

from .layout import assert_layout

# ---- turns of a made-up three-call episode ---------------------------------------------------


def three_turns() -> list[dict[str, Any]]:
    return [
        {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [10, 11], "generation_log_probs": [-0.5, -0.25]},
        {"prompt_token_ids": [1, 2, 3, 10, 11, 4, 5], "generation_token_ids": [12], "generation_log_probs": [-1.0]},
        {"prompt_token_ids": [1, 2, 3, 10, 11, 4, 5, 12, 6], "generation_token_ids": [13, 14, 15],
         "generation_log_probs": [-0.1, -0.2, -0.3]},
    ]


VERIFY = {"responses_create_params": {"input": "hi"}, "reward": 1.0}


def test_three_turns_become_alternating_messages_of_new_tokens() -> None:
    result = to_nemo_rl_result(three_turns(), VERIFY)
    assert_layout(result)
    assert [(m["role"], m["token_ids"]) for m in result["message_log"]] == [
        ("user", [1, 2, 3]), ("assistant", [10, 11]), ("user", [4, 5]), ("assistant", [12]),
        ("user", [6]), ("assistant", [13, 14, 15])]
    assert result["message_log"][1]["generation_logprobs"] == [-0.5, -0.25]
    assert result["input_message_log"] == result["message_log"][:1]
    assert result["full_result"] == VERIFY


def test_policy_turns_and_tensors() -> None:
    torch = pytest.importorskip("torch")
    turns = [PolicyTurn(items=[{"type": "message", "role": "assistant", "content": "<think>x</think>ok"}], **t)
             for t in three_turns()]
    result = to_nemo_rl_result(turns, VERIFY, tensors=True)
    assert_layout(result)
    assert result["message_log"][0]["token_ids"].dtype == torch.int64
    assert result["message_log"][1]["generation_logprobs"].dtype == torch.float32
    assert result["message_log"][1]["has_malformed_thinking"] is True  # think tags left in a final message


def test_a_verify_reply_is_the_source_and_is_not_changed() -> None:
    items = [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", **three_turns()[0]},
             {"type": "function_call_output", "call_id": "c1", "output": "{}"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "<tool_call>"}],
              **three_turns()[1]}]
    reply = {**VERIFY, "response": {"output": items}, "reward_components": {"a": 0.25, "b": 0.75}}
    before = copy.deepcopy(reply)
    result = to_nemo_rl_result(reply)
    assert reply == before
    assert_layout(result)
    assert [m["role"] for m in result["message_log"]] == ["user", "assistant"] * 2
    assert result["message_log"][3]["is_invalid_tool_call"] is True  # tool-call markup the env did not run
    assert all(not set(i) & {"prompt_token_ids", "generation_token_ids"}
               for i in result["full_result"]["response"]["output"])
    assert result["full_result"]["reward_components"] == {"a": 0.25, "b": 0.75}


def test_an_empty_generation_is_skipped_as_nemo_rl_skips_it() -> None:
    turns = three_turns()
    turns[1] = {**turns[1], "generation_token_ids": [], "generation_log_probs": []}
    turns[2] = {**turns[2], "prompt_token_ids": [1, 2, 3, 10, 11, 4, 5, 6]}
    result = to_nemo_rl_result(turns, VERIFY)
    assert [m["token_ids"] for m in result["message_log"]] == [[1, 2, 3], [10, 11], [4, 5, 6], [13, 14, 15]]


# ---- each invariant, violated on purpose -----------------------------------------------------


def _broken(turn: int, **change: Any) -> list[dict[str, Any]]:
    turns = three_turns()
    turns[turn] = {**turns[turn], **change}
    return turns


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        (_broken(1, prompt_token_ids=[1, 2, 9, 10, 11, 4]), r"turn 2 .*not a continuation.*position 2, expected 3, got 9"),
        (_broken(2, prompt_token_ids=[1, 2, 3, 10]), r"turn 3 .*not a continuation.*expected 11, got the end"),
        (_broken(1, prompt_token_ids=[1, 2, 3, 10, 11]), r"turn 2 .*adds no token"),
        (_broken(0, prompt_token_ids=[]), r"turn 1 .*adds no token"),
        (_broken(0, generation_log_probs=[-0.5]), r"turn 1 .*1 generation_log_probs for 2 generation_token_ids"),
        (_broken(2, generation_log_probs=[-0.1, float("nan"), -0.3]), r"turn 3 .*\[1\] = nan is not a finite"),
        (_broken(2, generation_log_probs=[-0.1, float("-inf"), -0.3]), r"turn 3 .*-inf is not a finite"),
        (_broken(0, generation_log_probs=None), r"turn 1 .*must return log-probabilities"),
        (_broken(1, generation_token_ids=[1.5]), r"turn 2 .*generation_token_ids\[0\] = 1.5 is not a token id"),
        (_broken(1, generation_token_ids=[True]), r"turn 2 .*is not a token id"),
        (_broken(0, prompt_token_ids=[1, -2, 3]), r"turn 1 .*prompt_token_ids\[1\] = -2"),
        (_broken(2, prompt_token_ids=None), r"turn 3 .*no prompt_token_ids"),
        ([{"type": "function_call_output", "call_id": "c", "output": "x"}], r"no turn with token data"),
    ],
)
def test_each_broken_invariant_names_the_turn(turns: list, message: str) -> None:
    with pytest.raises(NemoRLFormatError, match=message):
        to_nemo_rl_result(turns, VERIFY)


@pytest.mark.parametrize(
    ("verify", "message"),
    [
        ({"reward": 1.0, "reward_components": {"a": 0.5, "b": 0.25}}, r"reward_components sum to 0.75"),
        ({"reward": float("nan")}, r"finite number"),
        ({"reward": True}, r"finite number"),
        ({"response": {}}, r"finite number"),
        ({"reward": 1.0, "reward_components": {"a": "x"}}, r"reward_components\['a'\]"),
    ],
)
def test_reward_checks(verify: dict, message: str) -> None:
    with pytest.raises(NemoRLFormatError, match=message):
        to_nemo_rl_result(three_turns(), verify)


def test_check_nemo_rl_result_rejects_broken_layouts() -> None:
    good = to_nemo_rl_result(three_turns(), VERIFY)
    cases = {
        "roles alternate": lambda r: r["message_log"].reverse(),
        "content must be ''": lambda r: r["message_log"][0].update(content="hi"),
        "token_ids is empty": lambda r: r["message_log"][2].update(token_ids=[]),
        "same length": lambda r: r["message_log"][1].update(generation_logprobs=[-1.0]),
        "message_log\\[:1\\]": lambda r: r.update(input_message_log=r["message_log"][2:3]),
        "no full_result": lambda r: r.pop("full_result"),
    }
    for message, breaks in cases.items():
        broken = copy.deepcopy(good)
        breaks(broken)
        with pytest.raises(NemoRLFormatError, match=message):
            check_nemo_rl_result(broken)


def test_token_turns_of_items_skip_environment_items() -> None:
    items = [{"type": "function_call_output", "call_id": "c", "output": "x"},
             {"type": "message", "role": "assistant", "content": "a", **three_turns()[0]}]
    turns = token_turns(items)
    assert len(turns) == 1 and turns[0].where == "output item 1"


# ---- step rewards ---------------------------------------------------------------------------------


def test_step_rewards_go_on_each_assistant_message() -> None:
    verdict = {**VERIFY, "reward": 1.0, "step_rewards": [0.25, 0.0, 0.5], "step_reward_sum": 0.75}
    result = to_nemo_rl_result(three_turns(), verdict)
    assert_layout(result)
    assert [m.get("step_reward") for m in result["message_log"]] == [None, 0.25, None, 0.0, None, 0.5]
    assert result["full_result"]["step_rewards"] == [0.25, 0.0, 0.5]
    assert result["full_result"]["reward"] == 1.0  # the episode's reward is not changed by its step rewards
    check_nemo_rl_result(result)


def test_without_step_rewards_messages_have_none() -> None:
    result = to_nemo_rl_result(three_turns(), VERIFY)
    assert all("step_reward" not in m for m in result["message_log"])


@pytest.mark.parametrize(("step_rewards", "why"), [
    ([0.25, 0.0], r"2 step_rewards for 3 model calls"),
    ([0.25, "x", 0.0], r"step_rewards\[1\] = 'x' is not a finite number"),
    ([0.25, float("nan"), 0.0], r"step_rewards\[1\] = nan"),
    ({"a": 1}, r"step_rewards must be a list"),
])
def test_bad_step_rewards_are_refused(step_rewards, why) -> None:
    with pytest.raises(NemoRLFormatError, match=why):
        to_nemo_rl_result(three_turns(), {**VERIFY, "step_rewards": step_rewards})
