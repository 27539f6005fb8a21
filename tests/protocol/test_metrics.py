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
    assert aggregate_metrics([]).agent_metrics == {}


def test_pass_rates_of_signed_and_fractional_rewards_are_rates():
    """A pass is a reward of at least 1.0; pass@k counts passes, whatever else the rewards are."""
    partial = aggregate_metrics([{"_ng_task_index": 0, "reward": 0.5}, {"_ng_task_index": 0, "reward": 0.25}])
    assert partial.agent_metrics["pass@2/reward"] == 0.0 and partial.agent_metrics["mean/reward"] == 0.375
    game = [{"_ng_task_index": t, "reward": r} for t, r in
            [(0, -0.64), (0, 1.0), (1, -0.1), (1, -0.3), (2, 1.0), (2, 1.3)]]
    agent = aggregate_metrics(game).agent_metrics
    assert agent["pass@1/reward"] == pytest.approx(100 * (0.5 + 0 + 1) / 3)
    assert agent["pass@2/reward"] == pytest.approx(100 * 2 / 3)
    assert agent["pass@1[avg-of-2]/reward"] == pytest.approx(100 * (0.5 + 0 + 1) / 3)
    assert all(0.0 <= v <= 100.0 for k, v in agent.items() if k.startswith("pass@"))
    assert agent["mean/reward"] == pytest.approx(sum(r["reward"] for r in game) / 6)
    strict = aggregate_metrics(game, pass_threshold=1.2).agent_metrics
    assert strict["pass@2/reward"] == pytest.approx(100 / 3)
