"""The NeMo RL result of real episodes: the embedded SmolLM2-135M (LocalPolicy) on the secret-words server.

Two sampled rollouts of one task (a prompt group of two), a few short generations in all;
then every invariant NeMo RL asserts is broken on purpose in copies of the real episodes.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from nemo_gym_env.adapters.nemo_rl import NemoRLFormatError, to_nemo_rl_result, token_turns
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.rollouts.jobs import RolloutJob, RolloutOptions, run_rollout
from nemo_gym_env.rollouts.output import is_failure

from ..conftest import secret_rows
from .layout import assert_layout, assert_masks_cover_generations, nemo_rl_consume

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replies(secret_server: str) -> list[dict[str, Any]]:
    """The /verify replies of two rollouts of task 0 (items carry the token data), played one after the other."""
    from nemo_gym_env.policies.local import LocalPolicy

    policy = LocalPolicy(max_new_tokens=32, temperature=0.7, seed=0)
    row = secret_rows()[0]

    async def play() -> list[dict[str, Any]]:
        client = ResourcesClient(secret_server)
        return [await run_rollout(RolloutJob(row, 0, k, client, policy, "secret_words"), RolloutOptions(max_steps=3))
                for k in range(2)]

    out = asyncio.run(play())
    assert not any(is_failure(r) for r in out), out
    return out


def _turns(reply: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in reply["response"]["output"] if "generation_token_ids" in item]


@pytest.fixture(scope="module")
def multi_turn(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """A reply with at least two model calls (the few-shot task makes the model call its tool)."""
    found = [r for r in replies if len(_turns(r)) >= 2]
    assert found, f"no multi-turn episode: turns per rollout {[len(_turns(r)) for r in replies]}"
    return found[0]


def test_real_episodes_give_the_layout(replies: list[dict[str, Any]]) -> None:
    for reply in replies:
        result = to_nemo_rl_result(reply)
        assert_layout(result)
        turns = _turns(reply)
        assert len(result["message_log"]) == 2 * len(turns)
        assert all(lp <= 0.0 for m in result["message_log"][1::2] for lp in m["generation_logprobs"])
        assert result["full_result"]["reward"] == reply["reward"]


def test_masks_cover_exactly_the_generated_tokens(replies: list[dict[str, Any]]) -> None:
    results = [to_nemo_rl_result(reply, tensors=True) for reply in replies]
    consumed = nemo_rl_consume(results, num_generations=2)
    assert consumed["groups"] == [[0, 1]]  # one task: one prompt group, keyed by the first message's tokens
    for index, reply in enumerate(replies):
        assert_masks_cover_generations(consumed, index, _turns(reply))
        mask = consumed["masks"][index].bool()
        expected = [lp for turn in _turns(reply) for lp in turn["generation_log_probs"]]
        assert consumed["logprobs"][index][mask].tolist() == pytest.approx(expected)


def test_tool_output_tokens_are_user_tokens(multi_turn: dict[str, Any]) -> None:
    result = to_nemo_rl_result(multi_turn)
    first, second = _turns(multi_turn)[:2]
    seen = len(first["prompt_token_ids"]) + len(first["generation_token_ids"])
    assert result["message_log"][2]["token_ids"] == second["prompt_token_ids"][seen:]  # the tool response, rendered


def _broken(reply: dict[str, Any], turn: int, **change: Any) -> dict[str, Any]:
    reply = copy.deepcopy(reply)
    _turns(reply)[turn].update(change)
    return reply


def test_each_invariant_broken_on_a_real_episode(multi_turn: dict[str, Any]) -> None:
    first, second = _turns(multi_turn)[:2]
    seen = first["prompt_token_ids"] + first["generation_token_ids"]
    prompt = second["prompt_token_ids"]
    flipped = list(prompt)
    flipped[len(first["prompt_token_ids"]) + 1] += 1  # a generated token re-tokenized differently
    cut = next(k for k in range(50, len(prompt)) if prompt[k] != prompt[0])  # the history's head dropped
    cases = [
        (_broken(multi_turn, 1, prompt_token_ids=flipped),
         rf"turn 2 \(output item \d+\): prompt_token_ids is not a continuation of the {len(seen)} tokens"),
        (_broken(multi_turn, 1, prompt_token_ids=prompt[cut:]),
         r"turn 2 .*first difference at position 0"),
        (_broken(multi_turn, 1, prompt_token_ids=list(seen)), r"turn 2 .*adds no token"),
        (_broken(multi_turn, 0, generation_log_probs=first["generation_log_probs"][:-1]),
         (rf"turn 1 .*{len(first['generation_token_ids']) - 1} generation_log_probs for "
          rf"{len(first['generation_token_ids'])} generation_token_ids")),
        (_broken(multi_turn, 1, generation_log_probs=[float("nan")] * len(second["generation_token_ids"])),
         r"turn 2 .*generation_log_probs\[0\] = nan is not a finite number"),
        (_broken(multi_turn, 0, generation_token_ids=[str(t) for t in first["generation_token_ids"]]),
         r"turn 1 .*generation_token_ids\[0\] = '\d+' is not a token id"),
        ({**multi_turn, "reward_components": {"word": multi_turn["reward"], "bonus": 0.5}},
         r"reward_components sum to"),
    ]
    for reply, message in cases:
        with pytest.raises(NemoRLFormatError, match=message):
            to_nemo_rl_result(reply)
    assert len(token_turns(multi_turn)) >= 2  # the real episode itself is untouched
    to_nemo_rl_result(multi_turn)
