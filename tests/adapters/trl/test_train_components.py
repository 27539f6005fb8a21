"""A real ``GRPOTrainer.train()`` step whose rewards are a verifier's reward components, weighted by TRL.

SmolLM2-135M plays a launched fixture server (``tests/fixtures/servers/rewards``) whose
``/verify`` gives each row's reward components and whose tool gives a step reward; the
trainer's reward functions are :func:`component_rewards`, weighted with ``reward_weights``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
import torch

import nemo_gym_env  # noqa: F401
from nemo_gym_env.adapters.trl import component_rewards, nemo_gym_rollout_func, tasks_dataset

from ...fixtures import fixture_specs
from .test_train import grpo_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def _rows() -> list[dict]:
    return [{"responses_create_params": {"input": [{"role": "user", "content": f"Say hello {n}."}]},
             "reward": 1.0 + n, "components": {"format": 1.0, "answer": float(n)}} for n in range(2)]


def test_grpo_step_weights_each_component(tmp_path, model_dir, tokenizer):
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from nemo_gym_env.launch.launcher import Launcher

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = _rows()
    seen: list[dict] = []
    with Launcher() as launcher:
        url = launcher.start(fixture_specs("rewards")["rewards"]).url
        # engine=False: this step generates with Hugging Face generate, as TRL does (the other steps use the engine).
        rollout = nemo_gym_rollout_func("NemoGym/Generic-v0", base_url=url, dataset=rows, max_turns=1, engine=False)

        def recorded(prompts, trainer):
            out = rollout(prompts, trainer)
            seen.append(out)
            return out

        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir), processing_class=tokenizer,
            reward_funcs=component_rewards(["format", "answer"]), train_dataset=tasks_dataset(rows),
            args=grpo_config(tmp_path, max_steps=1, max_completion_length=16, reward_weights=[0.5, 2.0]),
            rollout_func=recorded)
        try:
            trainer.train()
        finally:
            rollout.close()
            torch.set_num_threads(threads)
    assert trainer.state.global_step == 1
    out = seen[0]
    assert out["env_error"] == [None] * 4
    # Copies of a prompt play the same task: tasks 0, 0, 1, 1.
    assert out["component_format"] == [1.0] * 4 and out["component_answer"] == [0.0, 0.0, 1.0, 1.0]
    logged = trainer.state.log_history[0]
    assert logged["rewards/component_format/mean"] == pytest.approx(1.0)
    assert logged["rewards/component_answer/mean"] == pytest.approx(0.5)
    assert logged["reward"] == pytest.approx(0.5 * 1.0 + 2.0 * 0.5)  # TRL's weighted sum, averaged
