"""``recipes/trl_grpo.py`` runs as a user runs it, with a tiny budget (slow: loads the model, one step)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "trl_grpo.py"


def _badge_rows(tmp_path: Path, split: str, size: int, seed: int = 0) -> Path:
    from nemo_gym_env.servers.badge_lookup.make_dataset import make_dataset

    path = tmp_path / f"{split}{size}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in make_dataset(size, seed=seed, split=split)))
    return path


def test_recipe_trains_one_step_on_cpu_and_scores_held_out_rows_before_and_after(tmp_path, model_dir):
    """One training step, its metrics and curve; eval_dataset: greedy rollouts of the local policy before
    training and with the trained model, recorded in the results file (an earlier record of the same task,
    model, seed and route replaced, others kept)."""
    from nemo_gym_env.policies.models import DEFAULT_MODEL_NAME

    out, results = tmp_path / "run", tmp_path / "results" / "heldout.json"
    results.parent.mkdir()
    other = {"task": "other", "model": "m", "seed": 1, "route": "rollout_func", "before": 0.0, "after": 0.5}
    earlier = {"task": "badge_lookup", "model": DEFAULT_MODEL_NAME, "seed": 0, "route": "rollout_func",
               "before": 7.0, "after": 7.0}
    results.write_text(json.dumps({"runs": [other, earlier]}))
    command = [sys.executable, str(RECIPE), "env=NemoGym/badge_lookup-v0", f"dataset={_badge_rows(tmp_path, 'train', 4)}",
               f"eval_dataset={_badge_rows(tmp_path, 'heldout', 3)}", "eval_limit=2", f"results={results}",
               "steps=1", "batch_size=2", "num_generations=2", "max_turns=2", "max_completion_length=24",
               "torch_threads=1", f"output_dir={out}", f"plot={out / 'curve.png'}"]
    done = subprocess.run(command, check=False, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=1700)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["env/failed"] == 0.0 and metrics[0]["reward"] is not None
    assert "mean reward" in done.stdout
    # The config's own switch under the old name warned; TRL's reads of is_gradient_checkpointing still do.
    assert "`gradient_checkpointing` is deprecated" not in done.stderr
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "curve.png").stat().st_size > 0
    runs = json.loads(results.read_text())["runs"]
    assert runs[0] == other and len(runs) == 2  # the earlier record of this run (before 7.0) replaced
    run = runs[1]
    assert {k: run[k] for k in ("task", "seed", "steps", "train_rows", "heldout_rows", "route")} == {
        "task": "badge_lookup", "seed": 0, "steps": 1, "train_rows": 4, "heldout_rows": 2, "route": "rollout_func"}
    assert [e["step"] for e in run["evals"]] == [0, 1] and all(e["failed"] == 0 for e in run["evals"])
    assert 0.0 <= run["before"] <= 1.0 and 0.0 <= run["after"] <= 1.0
    assert run["before"] == run["evals"][0]["reward"] and run["after"] == run["evals"][1]["reward"]
    assert (out / "heldout" / "model" / "config.json").exists()  # the trained model the last evaluation loaded
    rows = [json.loads(line) for line in (out / "heldout" / "heldout_step1.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["responses_create_params"]["temperature"] == 0.0 for r in rows)  # greedy
    assert "held-out reward: before" in done.stdout


def test_recipe_refuses_held_out_rows_that_are_training_rows(tmp_path):
    train = _badge_rows(tmp_path, "train", 4)
    command = [sys.executable, str(RECIPE), "env=NemoGym/badge_lookup-v0", f"dataset={train}", f"eval_dataset={train}",
               f"output_dir={tmp_path / 'run'}"]
    done = subprocess.run(command, check=False, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert done.returncode != 0
    assert "4 of the 4 held-out rows are also training rows" in done.stderr
