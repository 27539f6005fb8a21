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


def _failed(task: int, rollout: int, reason: str) -> dict:
    return {**_row(task, rollout), "_ng_failure_class": "server_error", "failure_reason": reason}


def _sidecar(out) -> list[tuple[int, int, str]]:
    if not failures_path(out).exists():
        return []
    return [(f["_ng_task_index"], f["_ng_rollout_index"], f["failure_reason"])
            for f in map(json.loads, failures_path(out).read_text().splitlines())]


def test_a_verdict_that_judged_nothing_goes_to_the_sidecar_never_the_output(tmp_path):
    out = tmp_path / "r.jsonl"
    with RolloutWriter(out) as writer:
        writer.write({**_row(0, 0, 0.0), "failure_kind": "verify_timeout", "failure_reason": "slow", "response": {}})
        writer.write({**_row(0, 1, 0.0), "mask_sample": True})
        writer.write({**_row(0, 2, 0.0), "failure_kind": "wrong_answer"})  # the model's fault: a reward
    assert [(r["_ng_rollout_index"], r["reward"]) for r in map(json.loads, out.read_text().splitlines())] == [(2, 0.0)]
    failures = [json.loads(line) for line in failures_path(out).read_text().splitlines()]
    assert [(f["_ng_rollout_index"], f["_ng_failure_class"], f["failure_kind"]) for f in failures] == [
        (0, "server_error", "verify_timeout"), (1, "server_error", "masked")]
    assert "reward" not in failures[0] and failures[0]["response"] == {}
    assert "verify_timeout (infrastructure; no reward): slow" in failures[0]["failure_reason"]
    with RolloutWriter(out, resume=True) as writer:
        assert writer.done == {("s", "t0", 2)}  # a resume plays (0, 0) and (0, 1) again


def test_the_sidecar_holds_what_is_still_failed_after_a_resume(tmp_path):
    out = tmp_path / "r.jsonl"
    with RolloutWriter(out) as writer:
        writer.write(_row(0, 0))
        for task in (1, 2, 3):
            writer.write(_failed(task, 0, f"first {task}"))
    assert len(_sidecar(out)) == 3
    with RolloutWriter(out, resume=True) as writer:
        writer.write(_row(1, 0))  # retried and done
        writer.write(_failed(2, 0, "second 2"))  # failed again
        # task 3 not retried in this run (a --limit, say): its failure stays
    assert sorted(_sidecar(out)) == [(2, 0, "second 2"), (3, 0, "first 3")]
    with RolloutWriter(out, resume=True) as writer:
        writer.write(_row(2, 0))
        writer.write(_row(3, 0))
    assert _sidecar(out) == [] and not failures_path(out).exists()
    assert summarize(out)["num_failed"] == 0


def test_a_killed_run_s_stale_failures_are_dropped_when_it_resumes(tmp_path):
    """A writer that never closed (SIGKILL) leaves failures of rollouts that later succeeded; a resume drops them."""
    out = tmp_path / "r.jsonl"
    writer = RolloutWriter(out)
    writer.write(_failed(0, 0, "first"))
    writer.write(_row(0, 0))
    writer.sync()  # no close(): as after a kill
    assert len(_sidecar(out)) == 1
    RolloutWriter(out, resume=True).close()
    assert _sidecar(out) == []


def test_rows_an_older_version_wrote_as_rewards_are_retried(tmp_path):
    """A verify timeout written as an ordinary row with reward 0.0 (before this was a failure) moves to the
    sidecar on resume, so the resume plays it again."""
    out = tmp_path / "r.jsonl"
    rows = [_row(0, 0), {**_row(1, 0, 0.0), "failure_kind": "verify_timeout", "failure_reason": "slow"},
            {**_row(2, 0, 0.0), "failure_kind": "syntax_error"}]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with RolloutWriter(out, resume=True) as writer:
        assert writer.done == {("s", "t0", 0), ("s", "t2", 0)}
        writer.write(_row(1, 0))
    kept = [(r["_ng_task_index"], r["reward"]) for r in map(json.loads, out.read_text().splitlines())]
    assert kept == [(0, 1.0), (2, 0.0), (1, 1.0)]
    assert _sidecar(out) == []
