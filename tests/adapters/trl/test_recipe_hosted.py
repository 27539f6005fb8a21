"""A GRPO step of ``recipes/trl_grpo.py`` on a hosted env: Gymnasium's Blackjack-v1 served by the bridge
(slow: loads the model, one step). Train and held-out rows come from the bridge's dataset writer."""

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


def test_one_grpo_step_on_blackjack_with_held_out_seeds(tmp_path, model_dir):
    from nemo_gym_env.bridge.datasets import make_dataset

    paths = {}
    for split, size in (("train", 4), ("heldout", 2)):
        paths[split] = tmp_path / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in make_dataset("blackjack", size, split=split)))
    out = tmp_path / "run"
    command = [sys.executable, str(RECIPE), "env=NemoGym/blackjack-v0", f"dataset={paths['train']}",
               f"eval_dataset={paths['heldout']}", "eval_limit=2", f"results={tmp_path / 'heldout.json'}",
               "steps=1", "batch_size=2", "num_generations=2", "max_turns=2", "max_completion_length=16",
               "torch_threads=1", f"output_dir={out}"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=1700,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["env/failed"] == 0.0
    assert -1.0 <= metrics[0]["reward"] <= 1.0  # a blackjack hand's return
    run = json.loads((tmp_path / "heldout.json").read_text())["runs"][-1]
    assert run["task"] == "blackjack" and [e["step"] for e in run["evals"]] == [0, 1]
