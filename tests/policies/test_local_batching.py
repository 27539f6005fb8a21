"""LocalPolicy's batches with the real embedded model: the same tokens batched or alone, each turn its own
row, a failing model failing its batch only, usage on rollout rows. Few, short generations."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import nemo_gym_env  # noqa: E402,F401  (registers the env ids)
from nemo_gym_env.client.loop import background_loop  # noqa: E402
from nemo_gym_env.errors import PolicyError  # noqa: E402
from nemo_gym_env.launch.catalog import bundled_dataset  # noqa: E402
from nemo_gym_env.policies import PolicyRequest  # noqa: E402
from nemo_gym_env.policies.local import LocalPolicy  # noqa: E402
from nemo_gym_env.protocol.dataset import load_rows  # noqa: E402
from nemo_gym_env.rollouts.jobs import collect  # noqa: E402
from nemo_gym_env.rollouts.output import RolloutWriter, failures_path, is_failure, read_rollouts  # noqa: E402

pytestmark = pytest.mark.slow

TOOL_ROWS = load_rows(bundled_dataset("example_single_tool_call"))
QUESTIONS = ["Name a colour.", "What is 2 + 2?", "Say hi.", "Who wrote Hamlet? Answer in one sentence.",
             "List three fruits.", "Write one line about the sea."]


def _request(question: str, budget: int = 16, **sampling: Any) -> PolicyRequest:
    return PolicyRequest(input=[{"role": "user", "content": question}], history=[],
                         sampling={"max_output_tokens": budget, **sampling})


def _alone(policy: LocalPolicy, requests: list[PolicyRequest]) -> list:
    async def main() -> list:
        return [await policy.generate(r) for r in requests]
    return background_loop().run(main())


def _together(policy: LocalPolicy, requests: list[PolicyRequest]) -> list:
    async def main() -> list:
        return await asyncio.gather(*(policy.generate(r) for r in requests))
    return background_loop().run(main())


@pytest.fixture(scope="module")
def greedy() -> LocalPolicy:
    policy = LocalPolicy(temperature=0.0, batch_wait_s=0.2)
    yield policy
    policy.close()


def test_batched_greedy_gives_the_tokens_of_each_prompt_alone(greedy):
    """Prompts of different lengths (left-padded in one batch) continue exactly as they do alone.

    The logits are not bit-identical (the matrix kernels sum in another order for another number
    of rows: about 1e-5, padding or not), so the log-probs are compared approximately; the
    tokens, for these prompts, are the same.
    """
    requests = [_request(q) for q in QUESTIONS]
    fresh = LocalPolicy(model_path=greedy.model.name_or_path, temperature=0.0, prefix_cache_mb=0)
    alone = _alone(fresh, requests)
    fresh.close()
    before = greedy.stats
    together = _together(greedy, requests)
    after = greedy.stats
    assert after["row_steps"] - before["row_steps"] > after["steps"] - before["steps"]  # steps decoded several turns
    for a, b in zip(alone, together):
        assert b.generation_token_ids == a.generation_token_ids
        assert b.text == a.text
        assert b.generation_log_probs == pytest.approx(a.generation_log_probs, abs=1e-3)
        assert b.prompt_token_ids == a.prompt_token_ids
        assert (b.input_tokens, b.output_tokens) == (len(b.prompt_token_ids), len(b.generation_token_ids))


def test_each_row_stops_at_its_own_budget_and_end(greedy):
    budgets = [1, 3, 40, 7]
    turns = _together(greedy, [_request(QUESTIONS[n], budget) for n, budget in enumerate(budgets)])
    end = greedy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for turn, budget in zip(turns, budgets):
        ids = turn.generation_token_ids
        assert 1 <= len(ids) <= budget
        assert end not in ids[:-1]  # nothing after the end of the turn
        assert ids[-1] == end or len(ids) == budget
        assert len(turn.generation_log_probs) == len(ids)


def test_seeded_sampling_is_the_same_one_at_a_time_or_batched(greedy):
    requests = [_request(q, 12, temperature=0.9, top_p=0.95) for q in QUESTIONS[:4]]
    path = greedy.model.name_or_path
    first, second = LocalPolicy(model_path=path, seed=3), LocalPolicy(model_path=path, seed=3, batch_wait_s=0.2)
    alone, together = _alone(first, requests), _together(second, requests)
    assert second.stats["mean_batch"] > 1
    assert [t.generation_token_ids for t in alone] == [t.generation_token_ids for t in together]
    first.close()
    second.close()


def test_a_later_turn_reuses_the_states_of_the_earlier_one(greedy):
    """The next turn's prompt extends the previous turn's tokens; only the new tokens are computed."""
    env = gym.make("NemoGym/example_single_tool_call-v0", max_steps=2)
    try:
        obs, info = env.reset(options={"task_index": 0})
        request = PolicyRequest(input=obs, history=[], tools=info["tools"], sampling={"max_output_tokens": 8})
        first = background_loop().run(greedy.generate(request))
        history = first.action() + [{"type": "function_call_output", "call_id": "c1", "output": "cold"}]
        before = dict(greedy.stats)
        second = background_loop().run(greedy.generate(
            PolicyRequest(input=obs, history=history, tools=info["tools"], sampling={"max_output_tokens": 8})))
    finally:
        env.close()
    seen = first.prompt_token_ids + first.generation_token_ids
    assert second.prompt_token_ids[: len(seen)] == seen
    cached = greedy.stats["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    computed = greedy.stats["computed_prompt_tokens"] - before["computed_prompt_tokens"]
    assert cached == len(seen) - 1  # everything but the last generated token, whose states were never computed
    assert computed == len(second.prompt_token_ids) - cached


def test_closing_stops_a_running_generation(greedy):
    policy = LocalPolicy(model_path=greedy.model.name_or_path, temperature=0.0)

    async def main() -> Any:
        turn = asyncio.ensure_future(policy.generate(_request("Tell me a long story about a cat.", 400)))
        while not policy.stats["steps"]:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        await policy.aclose()  # the batch stops at its next step, not after 400 tokens
        return await asyncio.gather(turn, return_exceptions=True)

    (result,) = background_loop().run(main())
    assert isinstance(result, PolicyError) and "closed" in str(result)
    with pytest.raises(PolicyError, match="closed"):
        background_loop().run(policy.generate(_request("Hi")))


class _FailingModel:
    """The real model, except that its first decoding step with ``rows`` rows raises."""

    def __init__(self, model: Any, rows: int):
        self._model = model
        self.rows = rows
        self.steps: list[tuple[int, bool]] = []  # (rows, raised) of each decoding step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, *, input_ids: Any, **kwargs: Any) -> Any:
        if input_ids.shape[1] == 1:
            raised = input_ids.shape[0] == self.rows and not any(r for _, r in self.steps)
            self.steps.append((input_ids.shape[0], raised))
            if raised:
                raise RuntimeError("deliberate failure in the middle of a batch")
        return self._model(input_ids=input_ids, **kwargs)


def test_a_model_that_raises_fails_the_episodes_of_that_batch_only(launched, tmp_path):
    policy = LocalPolicy(temperature=0.0, max_new_tokens=12, max_batch_size=4, batch_wait_s=0.3)
    failing = _FailingModel(policy.model, rows=4)
    policy._batcher.model = failing  # the real LocalPolicy and batcher path, with a model that raises once

    async def run() -> list[dict]:
        return [row async for row in collect(TOOL_ROWS, policy, launched["example_single_tool_call"], num_repeats=2,
                                             concurrency=10, max_steps=2, server_name="example_single_tool_call")]

    rows = background_loop().run(run())
    policy.close()
    out = tmp_path / "rollouts.jsonl"
    with RolloutWriter(out) as writer:
        for row in rows:
            writer.write(row)

    keys = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows)
    assert keys == sorted((t, r) for t in range(len(TOOL_ROWS)) for r in range(2))  # none lost, none twice
    assert [raised for _, raised in failing.steps].count(True) == 1
    failures = [r for r in rows if is_failure(r)]
    assert len(failures) == 4  # the turns decoded in the step that raised
    for failure in failures:
        assert failure["_ng_failure_class"] == "policy_error"
        assert ("failed on a batch of 4 turn(s): RuntimeError: deliberate failure in the middle of a batch"
                in failure["failure_reason"])
    written = [json.loads(line) for line in failures_path(out).read_text().splitlines()]
    assert len(written) == 4
    done, _ = read_rollouts(out)
    assert len(done) == len(rows) - 4
    for row in done:  # the others went on, usage counted from the token data of every turn
        model_items = [i for i in row["response"]["output"] if "generation_token_ids" in i]
        usage = row["response"]["usage"]
        assert usage["input_tokens"] == sum(len(i["prompt_token_ids"]) for i in model_items) > 0
        assert usage["output_tokens"] == sum(len(i["generation_token_ids"]) for i in model_items) > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_vector_env_turns_gathered_together_share_one_batch(greedy):
    """The vector env with the local policy: the live sub-envs' turns, awaited together, are one batch."""
    envs = gym.make_vec("NemoGym/example_single_tool_call-v0", num_envs=4, max_steps=1)
    try:
        obs, infos = envs.reset(seed=0)
        requests = [PolicyRequest(input=o, history=[], tools=infos["tools"][i], sampling={"max_output_tokens": 6})
                    for i, o in enumerate(obs)]
        before = greedy.stats["batch_sizes"].get(4, 0)
        turns = _together(greedy, requests)
        assert greedy.stats["batch_sizes"].get(4, 0) > before  # steps that decoded all four
        obs, rewards, terminations, truncations, infos = envs.step([t.action() for t in turns])
        assert all(terminations | truncations)
    finally:
        envs.close()


def test_draft_tokens_leave_every_token_of_a_tool_call_turn_as_it_is(greedy):
    """The default policy feeds greedy turns draft tokens from their own prompt (a tool's name and argument
    names are in the tool list): the turns are those of one token a step, in fewer steps."""
    requests = [PolicyRequest(input=row["responses_create_params"]["input"], history=[],
                              tools=row["responses_create_params"]["tools"], sampling={"max_output_tokens": 40})
                for row in TOOL_ROWS[:3]]
    plain = LocalPolicy(model_path=greedy.model.name_or_path, temperature=0.0, prefix_cache_mb=0, draft_tokens=0)
    one_a_step = _together(plain, requests)
    plain.close()
    before = greedy.stats
    drafted = _together(greedy, requests)
    after = greedy.stats
    assert after["accepted_drafts"] > before["accepted_drafts"]
    assert after["steps"] - before["steps"] < max(len(t.generation_token_ids) for t in drafted)
    for a, b in zip(one_a_step, drafted):
        assert b.generation_token_ids == a.generation_token_ids
        assert b.generation_log_probs == pytest.approx(a.generation_log_probs, abs=1e-3)
