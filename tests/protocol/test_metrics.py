"""Aggregate metrics of verify replies (``pass@k`` and friends): pure functions."""

from __future__ import annotations

import pytest

from nemo_gym_env.protocol.metrics import aggregate_metrics, pass_at_k


def test_pass_at_k():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_aggregate_metrics_binary_and_continuous():
    rows = [{"_ng_task_index": t, "_ng_rollout_index": r, "reward": float(r == 0), "accuracy": r == 0, "note": "x"}
            for t in range(3) for r in range(4)]
    metrics = aggregate_metrics(rows)
    agent = metrics.agent_metrics
    assert agent["mean/reward"] == 0.25 and agent["mean/accuracy"] == 0.25
    assert agent["pass@1/reward"] == pytest.approx(25.0) and agent["pass@4/reward"] == 100.0
    assert "mean/note" not in agent and agent["num_tasks"] == 3
    assert metrics.key_metrics["pass@4/reward"] == 100.0
    continuous = aggregate_metrics([{"_ng_task_index": 0, "reward": 0.5}, {"_ng_task_index": 0, "reward": 0.25}])
    assert continuous.agent_metrics["pass@2/reward"] == 50.0
    assert aggregate_metrics([]).agent_metrics == {}
