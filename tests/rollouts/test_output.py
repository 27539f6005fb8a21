"""The rollout library and the head server's document, in process."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from omegaconf import OmegaConf

from nemo_gym_env.errors import RolloutFileError
from nemo_gym_env.launch.catalog import bundled_dataset
from nemo_gym_env.launch.head import public_config
from nemo_gym_env.policies import Policy, PolicyRequest, PolicyTurn, ScriptedPolicy
from nemo_gym_env.protocol.dataset import load_rows
from nemo_gym_env.rollouts.jobs import apply_sampling, collect
from nemo_gym_env.rollouts.output import RolloutWriter, failures_path, is_failure, read_rollouts
from nemo_gym_env.rollouts.report import Progress, metrics_table, summarize


def _row(task: int, rollout: int, reward: float = 1.0, server: str = "s") -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward,
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
        assert writer.done == {(0, 0), (0, 1)}
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


def test_a_damaged_middle_line_is_an_error(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(_row(0, 0)) + "\nnot json\n" + json.dumps(_row(0, 1)) + "\n")
    with pytest.raises(RolloutFileError, match=":2: not JSON"):
        RolloutWriter(out, resume=True)
    out.write_text(json.dumps(_row(0, 0)) + "\n" + json.dumps({"reward": 1}) + "\n")
    with pytest.raises(RolloutFileError, match="_ng_task_index"):
        read_rollouts(out)


def test_apply_sampling_does_not_touch_the_original():
    row = {"responses_create_params": {"input": "hi", "temperature": 1.0}, "x": 1}
    assert apply_sampling(row, {"temperature": 0.1, "top_p": None})["responses_create_params"]["temperature"] == 0.1
    assert row["responses_create_params"]["temperature"] == 1.0
    assert apply_sampling(row, {}) is row


def test_progress_plain_lines_when_not_a_tty():
    stream = io.StringIO()
    progress = Progress(20, stream=stream)
    for i in range(20):
        progress.update(_row(i, 0, reward=float(i % 2)))
    progress.close()
    lines = stream.getvalue().splitlines()
    assert 5 <= len(lines) <= 12 and "\r" not in stream.getvalue()
    assert lines[-1].startswith("rollouts 20/20 100%") and "mean reward 0.500" in lines[-1]


def test_public_config_scrubs_interpolated_secrets():
    cfg = OmegaConf.create({
        "policy_api_key": "CANARY-123456",
        "server": {"resources_servers": {"impl": {"url": "http://h/?k=${policy_api_key}", "max_tokens": 5}}},
        "missing": "???",
        "dangling": "${nope}",
    })
    doc = public_config(cfg)
    assert "CANARY" not in json.dumps(doc)
    assert doc["server"]["resources_servers"]["impl"] == {"url": "http://h/?k=***REDACTED***", "max_tokens": 5}
    assert doc["missing"] == "???"


class _Exploding(Policy):
    name = "exploding"

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        raise ConnectionRefusedError("policy endpoint refused")


def test_collect_against_a_launched_server(launched):
    server = "example_single_tool_call"
    rows = load_rows(bundled_dataset(server))

    async def run(policy, **kwargs):
        return [row async for row in collect(rows, policy, launched[server], server_name=server, **kwargs)]

    results = asyncio.run(run(ScriptedPolicy(server), num_repeats=3, concurrency=4, skip={(0, 0), (4, 2)},
                              sampling={"temperature": 0.5}))
    keys = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in results}
    assert keys == {(t, r) for t in range(5) for r in range(3)} - {(0, 0), (4, 2)}
    assert len(results) == 13 and all(r["reward"] == 1.0 and not is_failure(r) for r in results)
    assert results[0]["responses_create_params"]["temperature"] == 0.5
    assert results[0]["agent_ref"] == {"type": "resources_servers", "name": server}

    failed = asyncio.run(run(_Exploding(), concurrency=2))
    assert len(failed) == 5 and all(is_failure(r) for r in failed)
    assert failed[0]["_ng_failure_class"] == "policy_error" and "refused" in failed[0]["failure_reason"]


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
        assert len(writer.done) == kept
        writer.write(_row(5, 5))
    rows, torn = read_rollouts(out)
    assert torn == 0 and len(rows) == kept + 1
