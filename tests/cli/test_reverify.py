"""``nemo-gym-env reverify``: real CLI processes against launched or running servers, kills and resumes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.scripting import assistant_message
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.rollouts.output import failures_path, metrics_path
from nemo_gym_env.rollouts.reverify import reverified_row, verify_body

from ..fixtures import fixture_config, fixture_specs
from .conftest import CLI, assert_one_line_error, cli_env, descendants, read_jsonl, run_cli, wait_gone

pytestmark = pytest.mark.slow

ONE = "example_single_tool_call"


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _identity(row: dict) -> tuple:
    return row["agent_ref"]["name"], row["_ng_task_key"], row["_ng_rollout_index"]


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> list[dict]:
    """Rollouts of the bundled example_single_tool_call, collected once by the rollouts command."""
    out = tmp_path_factory.mktemp("stored") / "rollouts.jsonl"
    result = run_cli("rollouts", ONE, "--policy", "scripted", "--num-repeats", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out)
    assert len(rows) == 10 and all(r["reward"] == 1.0 for r in rows)
    return rows


def test_reverify_launches_the_rows_servers_and_reports_what_moved(stored, tmp_path):
    # What an old, buggy verifier wrote: every other row scored 0.
    old = [{**row, "reward": 0.0, "failure_kind": "old_bug"} if n % 2 else row for n, row in enumerate(stored)]
    source = _write(tmp_path / "rollouts.jsonl", old)
    result = run_cli("reverify", str(source))
    assert result.returncode == 0, result.stderr[-3000:]
    new = read_jsonl(tmp_path / "rollouts_reverified.jsonl")
    assert sorted(map(_identity, new)) == sorted(map(_identity, stored))  # every row once, same identities
    by_identity = {_identity(r): r for r in new}
    for row in stored:  # the current verifier gives what it gave: same reward, same episode, no stale verdict
        again = by_identity[_identity(row)]
        assert again["reward"] == 1.0 and "failure_kind" not in again
        assert again["response"] == row["response"] and again["_ng_task_index"] == row["_ng_task_index"]
    line = next(line for line in result.stdout.splitlines() if line.startswith(ONE))
    assert line.split() == [ONE, "10", "5", "0.500", "1.000"]  # rows, reward moved, mean before, mean after
    metrics = json.loads(metrics_path(tmp_path / "rollouts_reverified.jsonl").read_text())
    assert metrics["agent_metrics"]["mean/reward"] == 1.0
    assert json.loads(source.read_text().splitlines()[1])["reward"] == 0.0  # the input is never changed


@pytest.mark.parametrize(("damage", "why"), [
    (lambda row: {k: v for k, v in row.items() if k != "response"}, "no verify body"),
    (lambda row: {**row, "response": {"output": "nothing"}}, "no verify body"),
    (lambda row: {k: v for k, v in row.items() if k != "responses_create_params"}, "no verify body: no 'responses_create_params'"),
    (lambda row: {k: v for k, v in row.items() if not k.startswith("_ng_")}, "no identity"),
    (lambda row: [row], "not a JSON object"),
])
def test_a_row_without_a_verify_body_is_named_and_nothing_is_written(stored, tmp_path, damage, why):
    rows = [stored[0], damage(stored[1]), stored[2]]
    source = _write(tmp_path / "bad.jsonl", rows)
    before = source.read_bytes()
    result = run_cli("reverify", str(source), "-o", str(tmp_path / "out.jsonl"), "--server-url", "http://127.0.0.1:9")
    assert_one_line_error(result)
    assert f"bad.jsonl:2: {why}" in result.stderr and "nothing was re-verified" in result.stderr
    assert not (tmp_path / "out.jsonl").exists() and source.read_bytes() == before


def test_not_json_and_same_file_are_refused(stored, tmp_path):
    source = tmp_path / "torn.jsonl"
    source.write_text(json.dumps(stored[0]) + "\n{\"_ng_task_index\": 0, \"rew\n")
    result = run_cli("reverify", str(source), "--server-url", "http://127.0.0.1:9")
    assert_one_line_error(result)
    assert "torn.jsonl:2: not JSON" in result.stderr
    result = run_cli("reverify", str(_write(tmp_path / "a.jsonl", stored)), "-o", str(tmp_path / "a.jsonl"),
                     "--server-url", "http://127.0.0.1:9")
    assert_one_line_error(result)
    assert "the output is the input file" in result.stderr


def test_a_server_that_cannot_verify_fails_rows_into_the_sidecar(stored, tmp_path):
    source = _write(tmp_path / "rollouts.jsonl", stored[:3])
    out = tmp_path / "out.jsonl"
    result = run_cli("reverify", str(source), "-o", str(out), "--server-url", "http://127.0.0.1:9", "--timeout", "5")
    assert result.returncode == 1
    assert read_jsonl(out) == []
    failures = read_jsonl(failures_path(out))
    assert len(failures) == 3 and all("cannot connect" in f["failure_reason"] for f in failures)


def _synthetic(n: int) -> list[dict]:
    """Rollout rows of the rewards fixture server: a slow verifier that now scores 1.0 (0.0 before)."""
    rows = []
    for i in range(n):
        rows.append({
            "responses_create_params": {"input": f"task {i}"}, "verify_delay_s": 0.2, "new_reward": 1.0,
            "response": make_response([assistant_message("done")]).model_dump(mode="json", exclude_none=True),
            "reward": 0.0, "step_rewards": [0.5, 0.0], "step_reward_sum": 0.5, "verify_reward": 0.0 if i % 2 else None,
            "agent_ref": {"type": "resources_servers", "name": "rewards"},
            "_ng_task_index": i, "_ng_task_key": f"k{i}", "_ng_rollout_index": 0,
        })
        if rows[-1]["verify_reward"] is None:
            del rows[-1]["verify_reward"]
    return rows


def test_kill_9_then_resume_reverifies_every_row_exactly_once(tmp_path):
    source = _write(tmp_path / "rollouts.jsonl", _synthetic(60))
    out = tmp_path / "new.jsonl"
    with Launcher() as launcher:
        url = launcher.start(fixture_specs("rewards")["rewards"]).url
        args = ["reverify", str(source), "-o", str(out), "--server-url", url, "--concurrency", "2"]
        proc = subprocess.Popen([*CLI, *args], env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 8):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        children = descendants(proc.pid)
        proc.kill()
        proc.communicate(timeout=30)
        assert wait_gone(children) == set()
        before = out.read_bytes().count(b"\n")
        assert 8 <= before < 60, "the kill did not land mid-run"
        with open(out, "ab") as handle:  # what a kill in the middle of a write leaves
            handle.write(b'{"_ng_task_index": 3, "rew')
        result = run_cli(*args, "--resume", "--concurrency", "8")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "torn last line" in result.stderr and f"{before} row(s) already there" in result.stderr
    rows = read_jsonl(out)
    keys = [r["_ng_task_key"] for r in rows]
    assert len(keys) == len(set(keys)) == 60, "a row was lost or re-verified twice"
    for row in rows:
        assert row["step_rewards"] == [0.5, 0.0]  # from the tools, kept
        # A row whose reward was /verify's plus its step rewards stays such a row.
        summed = row["_ng_task_index"] % 2 == 1
        assert row["reward"] == (1.5 if summed else 1.0)
        assert ("verify_reward" in row) == summed
    assert "rewards" in result.stdout and "60" in result.stdout


def test_launched_from_a_config_and_rows_routed_by_agent_ref(tmp_path):
    rows = [{**row, "verify_delay_s": 0} for row in _synthetic(4)]
    source = _write(tmp_path / "rollouts.jsonl", rows)
    result = run_cli("reverify", str(source), f"+config_paths=[{fixture_config('rewards')}]")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "started 1 server(s): rewards" in result.stderr
    assert len(read_jsonl(tmp_path / "rollouts_reverified.jsonl")) == 4


def test_verify_body_takes_the_verdict_off_and_reverified_row_puts_the_identity_back():
    row = {**_synthetic(2)[1], "reward_components": {"a": 1.0}, "failure_reason": "x", "mask_sample": False,
           "accuracy": 0.0}
    body = verify_body(row)
    assert not {"reward", "reward_components", "failure_reason", "mask_sample", "step_rewards", "step_reward_sum",
                "verify_reward", "_ng_task_index", "_ng_task_key", "_ng_rollout_index"} & set(body)
    assert body["response"] == row["response"] and body["agent_ref"] == row["agent_ref"]
    assert body["accuracy"] == 0.0  # a metric: the server recomputes it
    new = reverified_row(row, {**body, "reward": 0.25})
    assert new["_ng_task_key"] == "k1" and new["verify_reward"] == 0.25 and new["reward"] == 0.75


def test_the_servers_of_a_head_server(stored, tmp_path, serve):
    served = serve(ONE, "+head_server.port=0")
    source = _write(tmp_path / "rollouts.jsonl", [{**row, "reward": 0.5} for row in stored[:4]])
    result = run_cli("reverify", str(source), "--head-url", served.head)
    assert result.returncode == 0, result.stderr[-3000:]
    new = read_jsonl(tmp_path / "rollouts_reverified.jsonl")
    assert len(new) == 4 and all(row["reward"] == 1.0 for row in new)
    line = next(line for line in result.stdout.splitlines() if line.startswith(ONE))
    assert line.split() == [ONE, "4", "4", "0.500", "1.000"]
