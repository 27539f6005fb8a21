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


# ---- masked samples and failure kinds (NeMo Gym 0.7's mask_sample / failure_kind) ----------------


def _write(path, rows):
    import json

    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_masked_rows_are_counted_and_left_out_of_the_reward_metrics(tmp_path):
    import json

    from nemo_gym_env.rollouts.output import metrics_path
    from nemo_gym_env.rollouts.report import metrics_table, write_metrics

    out = tmp_path / "r.jsonl"
    masked = {"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed", "failure_reason": "judge down"}
    _write(out, [
        _row(0, 0, 1.0, "a"), _row(1, 0, 1.0, "a"), {**_row(2, 0, server="a"), **masked},
        {**_row(3, 0, server="a"), **masked}, {**_row(4, 0, 0.0, server="a"), "failure_kind": "verifier_error"},
        _row(0, 0, 0.0, "b"), {**_row(1, 0, 1.0, "b"), "mask_sample": False},
    ])
    summary = write_metrics(out)
    assert json.loads(metrics_path(out).read_text()) == summary  # what rollouts_metrics.json holds
    a, b = summary["per_server"]["a"], summary["per_server"]["b"]
    assert (a["num_rollouts"], a["num_masked"]) == (5, 2)
    assert a["agent_metrics"]["mean/reward"] == 2 / 3  # the masked zeros do not drag it down
    assert a["agent_metrics"]["num_tasks"] == 3
    assert a["failure_kinds"] == {"judge_failed": 2, "verifier_error": 1}
    assert (b["num_masked"], b["failure_kinds"], b["agent_metrics"]["mean/reward"]) == (0, {}, 0.5)
    assert (summary["num_rollouts"], summary["num_masked"]) == (7, 2)
    assert summary["agent_metrics"]["mean/reward"] == 3 / 5
    assert summary["failure_kinds"] == {"judge_failed": 2, "verifier_error": 1}
    assert a["outcomes"] == {"masked": 2, "right": 2, "verifier_error": 1}  # what each row says happened
    assert b["outcomes"] == {"right": 1, "wrong": 1}
    table = metrics_table(summary).splitlines()
    assert table[0].endswith("masked  what the model did")
    line_a = next(line for line in table if line.startswith("a "))
    assert "0.667" in line_a and line_a.endswith("masked 2, right 2, verifier_error 1")
    assert line_a.split()[7] == "2"  # the masked column (pass@k is "-": one rollout a task)
    line_b = next(line for line in table if line.startswith("b "))
    assert line_b.split()[7] == "0" and line_b.endswith("right 1, wrong 1")
    assert next(line for line in table if line.startswith("total")).split()[7] == "2"
    assert "verifier_error: the server's own failure_kind" in table


def test_a_server_whose_every_row_is_masked_has_no_mean_reward(tmp_path):
    from nemo_gym_env.rollouts.report import metrics_table, summarize

    out = tmp_path / "r.jsonl"
    _write(out, [{**_row(0, 0, 0.0), "mask_sample": True, "failure_kind": "transport_timeout"}])
    summary = summarize(out)
    entry = summary["per_server"]["s"]
    assert (entry["num_rollouts"], entry["num_masked"]) == (1, 1)
    assert "mean/reward" not in entry["agent_metrics"] or entry["agent_metrics"]["mean/reward"] is None
    line = metrics_table(summary).splitlines()[2]
    assert line.split()[4] == "-" and line.endswith("masked 1")
    assert entry["failure_kinds"] == {"transport_timeout": 1}
