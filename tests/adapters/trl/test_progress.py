"""The step line and its record (``nemo_gym_env.adapters.trl.progress``): what a person reads per optimizer step."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from nemo_gym_env.adapters.trl.progress import NO_SIGNAL_ADVICE, StepReport, step_line, step_summary

LOGS = {"loss": 0.012, "grad_norm": 1.84, "reward": 0.625, "reward_std": 0.518, "frac_reward_zero_std": 0.5,
        "rewards/env_reward/mean": 0.5, "env/num_turns": 1.9, "env/failed": 0.0}


def test_the_summary_counts_groups_with_a_learning_signal_and_keeps_the_envs_own_reward():
    summary = step_summary(LOGS, groups=2)
    assert summary == {"reward": 0.625, "env_reward": 0.5, "reward_std": 0.518, "groups": 2, "groups_with_signal": 1,
                       "grad_norm": 1.84, "loss": 0.012, "turns": 1.9, "failed": 0.0}
    assert step_summary({**LOGS, "frac_reward_zero_std": 0.0}, 4)["groups_with_signal"] == 4
    own = step_summary({**LOGS, "rewards/MyEnvironment/mean": 0.25}, 2, "rewards/MyEnvironment/mean")
    assert own["env_reward"] == 0.25
    assert step_summary({"reward": float("nan")}, 1)["reward"] is None  # every episode failed: no number


def test_a_line_says_reward_spread_signal_gradient_turns_and_time():
    line = step_line(3, 8, step_summary(LOGS, 2), 21.44)
    assert line == "step 3/8  reward 0.625 ± 0.518  env reward 0.500  signal in 1/2 groups  grad 1.84  turns 1.9  21.4 s"


def test_a_step_without_a_learning_signal_says_so_and_what_to_change():
    logs = {**LOGS, "grad_norm": 0.0, "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
            "rewards/env_reward/mean": 0.0, "env/failed": 0.25}
    line = step_line(2, 8, step_summary(logs, 2), 9.0)
    first, advice = line.split("\n")
    assert "signal in 0/2 groups" in first and "failed 25%" in first
    assert advice == f"  -> {NO_SIGNAL_ADVICE}"
    assert "raise temperature or num_generations" in advice


def test_the_callback_prints_each_step_once_and_writes_its_record(tmp_path):
    lines: list[str] = []
    report = StepReport(2, tmp_path / "metrics.jsonl", write=lines.append)
    state = SimpleNamespace(global_step=1, max_steps=4)
    report.on_train_begin(None, state, None)
    report.on_log(None, state, None, logs=LOGS)
    report.on_log(None, state, None, logs={"train_runtime": 12.0})  # the end-of-training summary: no line
    assert len(lines) == 1 and lines[0].startswith("step 1/4  reward 0.625")
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["summary"]["groups_with_signal"] == 1 and record["reward"] == 0.625
    assert report.rows == [record]
