"""The rollouts file (``rollouts.output``): appended row by row, resumed, read back; its failures sidecar and summary."""

from __future__ import annotations

import json

import pytest

from nemo_gym_env.errors import RolloutFileError
from nemo_gym_env.rollouts.output import RolloutWriter, failures_path, read_rollouts
from nemo_gym_env.rollouts.report import metrics_table, summarize


def _row(task: int, rollout: int, reward: float = 1.0, server: str = "s") -> dict:
    return {"_ng_task_index": task, "_ng_task_key": f"t{task}", "_ng_rollout_index": rollout, "reward": reward,
            "agent_ref": {"type": "resources_servers", "name": server}}


def test_writer_appends_resumes_and_cuts_a_torn_line(tmp_path):
    out = tmp_path / "sub" / "r.jsonl"
    with RolloutWriter(out) as writer:
        writer.write(_row(0, 0))
        writer.write(_row(0, 1))
        writer.write({**_row(1, 0), "_ng_failure_class": "server_error", "failure_reason": "boom sk-abcdefghijklmnopqrstuv"})
    assert [r["_ng_rollout_index"] for r in map(json.loads, out.read_text().splitlines())] == [0, 1]
    failure = json.loads(failures_path(out).read_text())
    assert "sk-abc" not in failure["failure_reason"] and "***REDACTED***" in failure["failure_reason"]

    with open(out, "ab") as handle:
        handle.write(b'{"_ng_task_index": 1, "_ng_roll')
    with RolloutWriter(out, resume=True, secrets=["PLAIN-SECRET"]) as writer:
        assert writer.done == {("s", "t0", 0), ("s", "t0", 1)}  # (server, task key, rollout index)
        assert writer.resumed_rows == 2 and writer.torn_bytes == len(b'{"_ng_task_index": 1, "_ng_roll')
        writer.write(_row(1, 0, 0.0))
        writer.write({**_row(1, 1), "_ng_failure_class": "policy_error", "failure_reason": "key PLAIN-SECRET"})
    rows, torn = read_rollouts(out)
    assert torn == 0 and [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows] == [(0, 0), (0, 1), (1, 0)]
    assert "PLAIN-SECRET" not in failures_path(out).read_text()

    summary = summarize(out)
    assert summary["num_rollouts"] == 3 and summary["num_failed"] == 1  # (1, 0) failed once, then succeeded
    assert summary["agent_metrics"]["mean/reward"] == pytest.approx(2 / 3)
    assert "pass@" in metrics_table(summary)

    with RolloutWriter(out) as writer:  # no resume: start over
        assert writer.done == set()
    assert out.read_text() == "" and not failures_path(out).exists()


def test_rows_without_a_task_key_are_matched_by_index(tmp_path):
    """A file written before task keys existed resumes by (server, task index, rollout index)."""
    out = tmp_path / "old.jsonl"
    legacy = {k: v for k, v in _row(3, 1).items() if k != "_ng_task_key"}
    out.write_text(json.dumps(legacy) + "\n")
    with RolloutWriter(out, resume=True) as writer:
        assert writer.done == set() and writer.done_legacy == {("s", 3, 1)}
        assert writer.is_done("s", "any-key", 3, 1) and not writer.is_done("s", "any-key", 3, 0)
        assert not writer.is_done("other", "any-key", 3, 1)


def test_a_damaged_middle_line_is_an_error(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row(0, 0)) + "\nnot json\n" + json.dumps(_row(0, 1)) + "\n")
    with pytest.raises(RolloutFileError, match=":2: not JSON"):
        RolloutWriter(out, resume=True)
    out.write_text(json.dumps(_row(0, 0)) + "\n" + json.dumps({"reward": 1}) + "\n")
    with pytest.raises(RolloutFileError, match="_ng_task_index"):
        read_rollouts(out)


@pytest.mark.parametrize(
    ("tail", "kept"),
    [
        ("", 1),
        ('{"_ng_task_index": 0, "_ng_rollout_index": 1}', 1),  # complete JSON but no newline: the write was cut
        ("not json\n", 1),  # a damaged last line
        ('{"_ng_task_index": 0, "_ng_rollout_index": 1}\n', 2),
    ],
)
def test_only_complete_lines_survive_a_resume(tmp_path, tail, kept):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row(0, 0)) + "\n" + tail)
    with RolloutWriter(out, resume=True) as writer:
        assert writer.resumed_rows == kept
        writer.write(_row(5, 5))
    rows, torn = read_rollouts(out)
    assert torn == 0 and len(rows) == kept + 1
