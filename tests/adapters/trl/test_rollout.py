"""The TRL adapter's rollout without a trainer: token assembly with the real tokenizer, real servers.

A scripted ``generate`` stands in for the model (it returns the tokens of fixed texts with
made-up log-probs), so every token of a rollout is known and can be checked against an
independent rendering of the conversation in SmolLM2's chat format.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")

import nemo_gym_env  # noqa: F401  (registers the ids)
from nemo_gym_env.adapters.trl import (
    env_reward,
    env_rows,
    nemo_gym_rollout_func,
    tasks_dataset,
)
from nemo_gym_env.policies.chat import tools_to_chat
from nemo_gym_env.policies.render import hermes_tools_block as _hermes_tools_block

from ..conftest import TARGET, secret_rows, secret_spec, tool_call_text, verify_log

END = "<|im_end|>"


def env_span(outputs: list[str]) -> str:
    """What follows a model turn that ended with <|im_end|>, in SmolLM2's ChatML, written out by hand."""
    blocks = "\n".join(f"<tool_response>\n{out}\n</tool_response>" for out in outputs)
    return f"\n<|im_start|>user\n{blocks}<|im_end|>\n<|im_start|>assistant\n"


class Scripted:
    """A stand-in model: row ``i`` says ``turns[i % len(turns)][k]`` at its k-th turn."""

    def __init__(self, tokenizer, turns: list[list[str]], on_call=None):
        self.tokenizer, self.turns, self.on_call = tokenizer, turns, on_call
        self.counts: dict[int, int] = {}
        self.calls = 0
        self.logprobs: dict[int, list[float]] = {}

    def __call__(self, prompts, budgets):
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self.calls)
        out = []
        for i, prompt in enumerate(prompts):
            if prompt is None:
                out.append(None)
                continue
            k = self.counts.get(i, 0)
            self.counts[i] = k + 1
            ids = self.tokenizer(self.turns[i % len(self.turns)][k], add_special_tokens=False)["input_ids"]
            lps = [-(n + 1) / 100 - i for n in range(len(ids))]
            self.logprobs.setdefault(i, []).extend(lps[: budgets[i]])
            out.append((ids, lps))
        return out


def spans(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 mask."""
    runs, start = [], 0
    for n in range(1, len(mask) + 1):
        if n == len(mask) or mask[n] != mask[start]:
            runs.append((mask[start], start, n))
            start = n
    return runs


def full_render(tokenizer, row: dict, assistant_and_tool: list[dict]) -> str:
    """The whole conversation rendered by the chat template in one go (tools as a Hermes system block)."""
    system = {"role": "system", "content": _hermes_tools_block(tools_to_chat(row["responses_create_params"]["tools"]))}
    return tokenizer.apply_chat_template([system, *row["responses_create_params"]["input"], *assistant_and_tool],
                                         tokenize=False)


# ---- token assembly -------------------------------------------------------------------------------


def test_rollout_tokens_masks_logprobs_and_rewards(tokenizer, secret_server):
    rows = secret_rows()
    dataset = tasks_dataset(rows)
    prompts = [dataset[0]["prompt"]] * 2 + [dataset[1]["prompt"]] * 2  # as TRL hands them over: repeated
    answers = {0: "fig", 1: "fig", 2: "yam", 3: "wrong"}
    turns = [[tool_call_text(TARGET) + END, f"{answers[i]}{END}"] for i in range(4)]
    generate = Scripted(tokenizer, turns)
    before = len(verify_log(secret_server))
    with nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=secret_server, dataset=rows, max_turns=4) as rollout:
        out = rollout.rollout(prompts, generate, tokenizer=tokenizer, max_completion_length=256)
        episodes = [row.episode for row in rollout.last_rows]

    assert {len(v) for v in out.values()} == {4}
    assert out["num_turns"] == [2, 2, 2, 2] and out["truncated"] == [False] * 4 and out["env_error"] == [None] * 4
    assert out["called_tool"] == [1.0] * 4
    server_rewards = verify_log(secret_server)[before:]
    assert sorted(out["env_reward"]) == sorted(server_rewards)
    assert out["env_reward"] == [e.last_verify["reward"] for e in episodes]
    assert [math.floor(r) for r in out["env_reward"]] == [1, 1, 1, 0]

    for i in range(4):
        row = rows[i // 2]
        word = row["words"][TARGET - 1]
        completion, mask, logprobs = out["completion_ids"][i], out["env_mask"][i], out["logprobs"][i]
        assert len(completion) == len(mask) == len(logprobs)
        # The whole sequence is what the chat template renders for the whole conversation.
        expected = full_render(tokenizer, row, [
            {"role": "assistant", "content": tool_call_text(TARGET)},
            {"role": "user", "content": f'<tool_response>\n{{"word":"{word}"}}\n</tool_response>'},
            {"role": "assistant", "content": answers[i]},
        ])
        assert out["prompt_ids"][i] + completion == tokenizer(expected.removesuffix("\n"),
                                                              add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(out["prompt_ids"][i]).endswith(f"Get secret word {TARGET}.<|im_end|>\n<|im_start|>assistant\n")
        # env_mask is 0 exactly on the tool output's tokens.
        runs = spans(mask)
        assert [value for value, _, _ in runs] == [1, 0, 1]
        _, start, end = runs[1]
        assert tokenizer.decode(completion[start:end]) == env_span([f'{{"word":"{word}"}}'])
        assert tokenizer.decode(completion[:start]) == tool_call_text(TARGET) + END
        assert tokenizer.decode(completion[end:]) == answers[i] + END
        # Log-probs: the model's own, in order, on model tokens; 0.0 on environment tokens.
        assert [lp for lp, m in zip(logprobs, mask) if m == 1] == generate.logprobs[i]
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)


def test_first_prompt_renders_tools_and_developer_as_system(tokenizer):
    rows = env_rows("NemoGym/example_single_tool_call-v0")
    prompts = [tasks_dataset(rows)[0]["prompt"]]
    with nemo_gym_rollout_func("NemoGym/example_single_tool_call-v0", max_turns=2) as rollout:
        out = rollout.rollout(prompts, Scripted(tokenizer, [["It is cold." + END]]), tokenizer=tokenizer,
                              max_completion_length=64)
    text = tokenizer.decode(out["prompt_ids"][0])
    developer = rows[0]["responses_create_params"]["input"][0]["content"]
    assert text.startswith(f"<|im_start|>system\n{developer}\n\n# Tools\n")
    assert '"name": "get_weather"' in text
    assert out["env_reward"] == [0.0] and out["env_mask"] == [[1] * len(out["completion_ids"][0])]


def test_token_budget_ends_and_verifies_the_episode(tokenizer, secret_server):
    rows = secret_rows()
    prompts = [tasks_dataset(rows)[0]["prompt"]] * 2
    call = tokenizer(tool_call_text(TARGET) + END, add_special_tokens=False)["input_ids"]
    # Row 0: the tool outputs do not fit after the call. Row 1: the call itself is cut by the budget.
    generate = Scripted(tokenizer, [[tool_call_text(TARGET) + END], [tool_call_text(TARGET) + " more" * 20 + END]])
    with nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=secret_server, dataset=rows, max_turns=4) as rollout:
        out = rollout.rollout(prompts, generate, tokenizer=tokenizer, max_completion_length=len(call) + 5)
        trajectories = [row.episode.trajectory for row in rollout.last_rows]
        verified = [row.episode.last_verify["response"]["output"] for row in rollout.last_rows]
    assert out["truncated"] == [True, True]
    assert all(r is not None and r < 1 for r in out["env_reward"])  # verified, and no answer was given
    assert out["completion_ids"][0] == call and out["env_mask"][0] == [1] * len(call)
    assert len(out["completion_ids"][1]) == len(call) + 5 and out["completion_ids"][1][-1] != call[-1]
    assert all(m == 1 for m in out["env_mask"][1])
    # The call ran, its output was never shown to the model, and /verify saw the episode so far: the
    # episode was finished as it stood, with no made-up assistant message after the tool output.
    assert [item["type"] for item in trajectories[0]] == ["function_call", "function_call_output"]
    assert [[item["type"] for item in output] for output in verified] == [
        [item["type"] for item in trajectory] for trajectory in trajectories]


def test_step_limit_verifies_truncated(tokenizer, secret_server):
    rows = secret_rows()
    generate = Scripted(tokenizer, [[tool_call_text(TARGET) + END]])
    with nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=secret_server, dataset=rows, max_turns=1) as rollout:
        out = rollout.rollout([tasks_dataset(rows)[0]["prompt"]], generate, tokenizer=tokenizer,
                              max_completion_length=256)
    assert out["truncated"] == [True] and out["num_turns"] == [1] and out["env_reward"][0] is not None
    assert out["env_mask"][0] == [1] * len(out["completion_ids"][0])  # no tool output after the last turn


def test_server_failure_masks_rows_and_keeps_the_count(tokenizer):
    from nemo_gym_env.launch.launcher import Launcher

    rows = secret_rows()
    prompts = [tasks_dataset(rows)[i // 2]["prompt"] for i in range(4)]
    with Launcher() as launcher:
        process = launcher.start(secret_spec())
        rollout = nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=process.url, dataset=rows, max_turns=4,
                                        request_timeout_s=10)

        def kill_on_first_call(n):
            if n == 1:
                launcher.stop(process.name)

        # Dies after the first generation: every episode fails mid-episode, at its tool call.
        generate = Scripted(tokenizer, [[tool_call_text(TARGET) + END, "fig" + END]], on_call=kill_on_first_call)
        out = rollout.rollout(prompts, generate, tokenizer=tokenizer, max_completion_length=256)
        assert {len(v) for v in out.values()} == {4}
        assert out["env_reward"] == [None] * 4
        assert all(set(mask) == {0} and len(mask) == len(ids) for mask, ids in zip(out["env_mask"], out["completion_ids"]))
        assert all(process.url in error and "/get_word" in error for error in out["env_error"])
        assert env_reward([""] * 4, **out) == [None] * 4

        # Down before the rollout: nothing to generate, still one (masked) row per prompt.
        generate = Scripted(tokenizer, [["never" + END]])
        out = rollout.rollout(prompts, generate, tokenizer=tokenizer, max_completion_length=256)
        rollout.close()
    assert generate.calls == 0
    assert out["env_reward"] == [None] * 4 and out["completion_ids"] == [[tokenizer.eos_token_id]] * 4
    assert out["env_mask"] == [[0]] * 4 and all("/seed_session" in e for e in out["env_error"])


def test_prompt_without_its_task_is_found_by_its_messages(tokenizer, secret_server):
    rows = secret_rows()
    bare = [{"role": m["role"], "content": m["content"]} for m in tasks_dataset(rows)[1]["prompt"]]
    with nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=secret_server, dataset=rows) as rollout:
        out = rollout.rollout([bare], Scripted(tokenizer, [["yam" + END]]), tokenizer=tokenizer,
                              max_completion_length=32)
        assert rollout.last_rows[0].episode.task_index == 1
        assert out["env_reward"][0] >= 1.0
        with pytest.raises(ValueError, match="tasks_dataset"):
            rollout.rollout([[{"role": "user", "content": "unknown"}]], Scripted(tokenizer, [["x"]]),
                            tokenizer=tokenizer, max_completion_length=32)


def test_a_simulated_users_messages_are_environment_tokens(tokenizer):
    """A conversational server: the customer's messages come back as environment tokens (env_mask 0),
    between the agent's own turns, and the episode is scored when the customer ends it."""
    from nemo_gym_env.protocol.parser import render_tool_call
    from nemo_gym_env.servers.retail_support.scripted import script

    rows = env_rows("NemoGym/retail_support-v0")[:1]
    turns = [(what[0] if kind == "say" else render_tool_call(*what)) + END for kind, *what in script(rows[0])]
    with nemo_gym_rollout_func("NemoGym/retail_support-v0", dataset=rows, max_turns=12) as rollout:
        out = rollout.rollout([tasks_dataset(rows)[0]["prompt"]], Scripted(tokenizer, [turns]), tokenizer=tokenizer,
                              max_completion_length=2048)
        verdict = rollout.last_rows[0].episode.last_verify
    assert out["env_reward"] == [1.0] and out["truncated"] == [False] and out["num_turns"] == [len(turns)]
    completion, mask = out["completion_ids"][0], out["env_mask"][0]
    runs = spans(mask)
    model = [tokenizer.decode(completion[start:end]) for value, start, end in runs if value == 1]
    environment = [tokenizer.decode(completion[start:end]) for value, start, end in runs if value == 0]
    assert model == turns  # every agent turn, and nothing else, is the model's
    assert tokenizer.decode(out["prompt_ids"][0]).endswith(f"{rows[0]['user']['opening']}<|im_end|>\n<|im_start|>assistant\n")
    said = verdict["info"]["conversation"]
    replies = [line["text"] for line in said[1:-1] if line["role"] == "user"]  # the opening is the prompt's
    assert len(replies) >= 2 and len(environment) == len(turns) - 1
    for reply in replies:
        assert sum(f"<|im_start|>user\n{reply}<|im_end|>" in span for span in environment) == 1
    assert verdict["user_usage"] == {"input_tokens": 0, "output_tokens": 0}
