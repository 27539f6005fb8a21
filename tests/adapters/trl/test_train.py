"""Real ``GRPOTrainer.train()`` steps with the real SmolLM2-135M against launched servers (slow, CPU).

Tiny budgets (2 steps, 2 generations, short completions) so they fit a 2-core CI machine.
What they establish about TRL 1.16, besides our adapter working:

- ``rollout_func`` receives the prompts already repeated ``num_generations`` times, the copies
  next to each other (``RepeatSampler(mini_repeat_count=num_generations)``), although its
  docstring says "no duplication"; the trainer needs exactly ``len(prompts)`` rows back.
- a reward function returning None for a sample makes it unscorable, and a batch of masked
  rows (``env_mask`` all 0) trains on without error.
"""

from __future__ import annotations

import copy
import math

import pytest

pytest.importorskip("trl")
import torch

import nemo_gym_env  # noqa: F401
from nemo_gym_env.adapters.trl import env_reward, nemo_gym_rollout_func, tasks_dataset
from nemo_gym_env.adapters.trl.generation import checkpointing

from ..conftest import secret_rows, secret_spec, verify_log

# Minutes each on an idle 2-core machine; a machine shared with other jobs can take several times longer.
# TRL 1.16 itself reads the model's is_gradient_checkpointing (unwrap_model_for_generation,
# disable_gradient_checkpointing), which transformers 5.x deprecates; our configs use the new name
# (checkpointing()), so that is the only FutureWarning left, and not ours to fix.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]

EOS = "<|im_end|>"


@pytest.fixture
def one_thread():
    """One torch thread: on a small machine busy with servers, OpenMP's second thread mostly spins."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def grpo_config(tmp_path, **overrides):
    from trl import GRPOConfig

    # 4 episodes per optimizer step, trained 2 at a time (one generation per step): the logits of a long
    # batch take gigabytes.
    settings = {"output_dir": str(tmp_path), "max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 2,
                "gradient_accumulation_steps": 2, "learning_rate": 1e-5, "max_completion_length": 72,
                "temperature": 1.0, "use_cpu": True, "bf16": False, **checkpointing(False),
                "logging_steps": 1, "report_to": "none", "save_strategy": "no", "seed": 0, "shuffle_dataset": False}
    settings.update(overrides)
    return GRPOConfig(**settings)


def env_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of every run of zeros in ``mask``."""
    runs, start = [], None
    for n, value in enumerate([*mask, 1]):
        if value == 0 and start is None:
            start = n
        elif value == 1 and start is not None:
            runs.append((start, n))
            start = None
    return runs


def output_groups(trajectory: list[dict]) -> list[list[str]]:
    """The tool outputs of each turn, in order, from an episode's trajectory (the server's replies)."""
    groups: list[list[str]] = []
    previous = None
    for item in trajectory:
        if item["type"] == "function_call_output":
            if previous != "function_call_output":
                groups.append([])
            groups[-1].append(item["output"])
        previous = item["type"]
    return groups


def expected_env_text(outputs: list[str], turn_ended: bool) -> str:
    """The environment's tokens after a model turn, in SmolLM2's ChatML, written out by hand."""
    blocks = "\n".join(f"<tool_response>\n{out}\n</tool_response>" for out in outputs)
    return ("" if turn_ended else EOS) + f"\n<|im_start|>user\n{blocks}<|im_end|>\n<|im_start|>assistant\n"


def test_grpo_rollout_func_trains_and_survives_a_dead_server(tmp_path, model_dir, tokenizer, one_thread):
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    from nemo_gym_env.launch.launcher import Launcher

    rows = secret_rows()
    launcher = Launcher()
    process = launcher.start(secret_spec())
    rollout = nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=process.url, dataset=rows, max_turns=3,
                                    request_timeout_s=10)
    calls, rewarded = [], []

    def recorded_rollout(prompts, trainer):
        out = rollout(prompts, trainer)
        calls.append({"prompts": copy.deepcopy(prompts), "out": out, "rows": list(rollout.last_rows),
                      "server": verify_log(process.url) if launcher.servers else None})
        return out

    def reward(completions, **kwargs):
        rewarded.append(list(kwargs["env_reward"]))
        return env_reward(completions, **kwargs)

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    after_first: dict[str, torch.Tensor] = {}

    class KillServerAfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                after_first.update({name: p.detach().clone() for name, p in model.named_parameters()})
                launcher.stop(process.name)

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=grpo_config(tmp_path), train_dataset=tasks_dataset(rows),
                          processing_class=tokenizer, rollout_func=recorded_rollout, callbacks=[KillServerAfterFirstStep()])
    try:
        trainer.train()
    finally:
        rollout.close()
        launcher.close()

    assert trainer.state.global_step == 2 and len(calls) == 2

    # The contract, as TRL 1.16 runs it: num_generations consecutive copies of each prompt, and
    # exactly as many rows back as prompts came in.
    for call in calls:
        prompts = call["prompts"]
        assert len(prompts) == trainer.args.generation_batch_size == 4  # duplicates included
        assert prompts[0] == prompts[1] and prompts[2] == prompts[3] and prompts[0] != prompts[2]
        assert {len(column) for column in call["out"].values()} == {4}
        tasks = [row.episode.task for row in call["rows"]]
        assert tasks[0] == tasks[1] and tasks[2] == tasks[3]  # copies of a prompt play the same task

    # Step 1: rewards are /verify's, as the server gave them and as the reward function got them.
    first = calls[0]
    assert first["out"]["env_reward"] == [row.episode.last_verify["reward"] for row in first["rows"]]
    assert sorted(first["out"]["env_reward"]) == sorted(first["server"])
    assert rewarded[0] == first["out"]["env_reward"]
    assert math.isclose(trainer.state.log_history[0]["rewards/reward/mean"], sum(rewarded[0]) / 4, rel_tol=1e-5)

    # env_mask is 0 exactly on the environment's tokens: the tool outputs the server sent back.
    tool_outputs_seen = 0
    for row, completion, mask in zip(first["rows"], first["out"]["completion_ids"], first["out"]["env_mask"]):
        assert row.error is None and len(mask) == len(completion) <= 72
        runs = env_runs(mask)
        groups = output_groups(row.episode.trajectory)
        # Every turn's outputs are shown to the model, except after the last turn when the episode hit a limit.
        assert len(runs) == len(groups) or (row.truncated and len(runs) == len(groups) - 1)
        model_spans = [span for span in ([0] + [e for r in runs for e in r] + [len(mask)])]
        assert sum(1 for a, b in zip(model_spans[::2], model_spans[1::2]) if b > a) == row.num_turns
        for (start, end), outputs in zip(runs, groups):
            ended = completion[start - 1] == tokenizer.eos_token_id
            assert tokenizer.decode(completion[start:end]) == expected_env_text(outputs, ended)
            tool_outputs_seen += 1
    assert tool_outputs_seen > 0, "no episode called the tool: nothing checked the environment tokens"

    # The weights moved on step 1's episodes.
    assert any(not torch.equal(initial[name], after_first[name]) for name in initial)

    # Step 2 ran against a dead server: every row masked and unscorable, the count unchanged, no crash.
    second = calls[1]["out"]
    assert second["env_reward"] == [None] * 4 and rewarded[1] == [None] * 4
    assert all(set(mask) == {0} for mask in second["env_mask"])
    assert all(process.url in error for error in second["env_error"])
    assert trainer.state.log_history[1]["reward"] is None  # NaN: no scorable sample, logged as None
