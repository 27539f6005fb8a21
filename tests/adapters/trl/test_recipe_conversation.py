"""A GRPO step of ``recipes/trl_grpo.py`` on a conversation: ``retail_support``, the embedded model as the agent and
the scripted customer answering it (slow: loads the model, one step). Which completion tokens are the customer's
(env_mask 0, out of the loss) is checked token by token in tests/adapters/trl/test_rollout.py; here TRL itself
counts only the model's tokens as the completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "trl_grpo.py"


def test_one_grpo_step_on_retail_support_with_the_customer_talking_back(tmp_path, model_dir):
    from nemo_gym_env.servers.retail_support.make_dataset import make_dataset

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in make_dataset(4, split="train")))
    out = tmp_path / "run"
    turns, turn_tokens = 4, 12
    command = [sys.executable, str(RECIPE), "env=NemoGym/retail_support-v0", f"dataset={train}", "steps=1",
               "batch_size=2", "num_generations=2", f"max_turns={turns}", f"max_turn_tokens={turn_tokens}",
               "max_completion_length=128", "torch_threads=1", f"output_dir={out}"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=1700,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    [step] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert step["env/failed"] == 0.0 and 0.0 <= step["reward"] <= 1.0
    # Short turns: each episode went on past its first turn, so the customer answered in it.
    assert step["env/num_turns"] > 1
    # TRL's completion length counts the tokens whose env_mask is 1: the model's turns only.
    assert step["completions/max_length"] <= turns * turn_tokens
