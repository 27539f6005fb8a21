"""Metrics and progress of a rollouts run (``rollouts.report``)."""

from __future__ import annotations

import io

from nemo_gym_env.rollouts.report import Progress


def _row(task: int, rollout: int, reward: float = 1.0, server: str = "s") -> dict:
    return {"_ng_task_index": task, "_ng_task_key": f"t{task}", "_ng_rollout_index": rollout, "reward": reward,
            "agent_ref": {"type": "resources_servers", "name": server}}


def test_progress_plain_lines_when_not_a_tty():
    stream = io.StringIO()
    progress = Progress(20, stream=stream)
    for i in range(20):
        progress.update(_row(i, 0, reward=float(i % 2)))
    progress.close()
    lines = stream.getvalue().splitlines()
    assert 5 <= len(lines) <= 12 and "\r" not in stream.getvalue()
    assert lines[-1].startswith("rollouts 20/20 100%") and "mean reward 0.500" in lines[-1]
