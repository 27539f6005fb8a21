"""Durability: a kill at any point of a rollouts run costs only the rows in flight (docs/rollouts.md).

The whole process group of ``nemo-gym-env rollouts`` is sent SIGKILL at many points of
multi-server runs (at several concurrencies, while the failures sidecar is being written),
then the same command is run again with ``--resume``; after the last resume every expected
rollout is in the file exactly once, no line is torn, the failures are counted once each, no
server outlives its killed parent, and no log folder is left in the temporary directory.
Bounded: a handful of kills per run, every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from nemo_gym_env.launch.catalog import bundled_dataset
from nemo_gym_env.protocol.dataset import load_rows
from nemo_gym_env.rollouts.output import failures_path
from nemo_gym_env.rollouts.report import summarize

from ..cli.conftest import CLI, cli_env, descendants, wait_gone
from ..fixtures import fixture_config
from ..fixtures.openai_server import running_server

pytestmark = pytest.mark.slow

FLAKY = fixture_config("flaky_seed")
DEADLINE_S = 240


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n") if path.exists() else [b""]


def _identities(path: Path) -> list[tuple[str, str, int]]:
    """Every complete row's identity; a torn last line (no newline) is not a row."""
    *complete, _torn = _lines(path)
    rows = [json.loads(line) for line in complete if line.strip()]
    return [(r["agent_ref"]["name"], r["_ng_task_key"], r["_ng_rollout_index"]) for r in rows]


def _complete_lines(path: Path) -> int:
    """Complete rows in ``path``, counted without parsing them (cheap enough to poll on a busy machine)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "rollouts", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _kill_at(args: list[str], env: dict[str, str], out: Path, rows: int) -> dict:
    """Run until ``out`` holds ``rows`` complete rows, then SIGKILL the whole process group."""
    proc = _start(args, env)
    deadline = time.monotonic() + DEADLINE_S
    while proc.poll() is None and _complete_lines(out) < rows and time.monotonic() < deadline:
        time.sleep(0.005)
    finished = proc.poll() is not None
    children = descendants(proc.pid)
    if not finished:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    identities = _identities(out)
    assert len(identities) == len(set(identities)), "a row was written twice"
    for line in _lines(failures_path(out))[:-1]:  # every complete sidecar line is a failure row
        if line.strip():
            assert json.loads(line)["_ng_failure_class"]
    return {"rows": len(identities), "finished": finished, "orphans": len(wait_gone(children))}


def _finish(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "rollouts", *args, "--resume"], env=env, capture_output=True, text=True,
                          timeout=DEADLINE_S, check=False)


def _private_tmp(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A temporary folder of the runs' own, so that what they leave there can be counted."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp, cli_env(TMPDIR=str(tmp))


def _log_folders(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("nemo_gym_env_logs_*"))


def test_the_issue_table_every_kill_resumes_to_2000_rows(tmp_path, figures):
    """Two servers played in order, killed at 200, 800, 1000 (the first server done) and 1800 rows."""
    tmp, env = _private_tmp(tmp_path)
    servers = ["example_multi_step", "example_session_state_mgmt"]
    table = []
    for kill_at in (200, 800, 1000, 1800):
        out = tmp_path / f"r{kill_at}.jsonl"
        args = [*servers, "--policy", "scripted", "--num-repeats", "200", "-o", str(out), "--no-env-yaml"]
        killed = _kill_at(args, env, out, kill_at)
        assert not killed["finished"] and killed["rows"] >= kill_at
        resumed = _finish(args, env)
        identities = _identities(out)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert len(identities) == len(set(identities)) == 2000
        assert Counter(server for server, _, _ in identities) == {s: 1000 for s in servers}
        assert killed["orphans"] == 0
        table.append((kill_at, killed["rows"], resumed.returncode, len(identities)))
    assert _log_folders(tmp) == [], "log folders of killed runs were left behind"
    figures.record("killed at (rows) / rows then / resume exit / rows after", table)


def test_a_subset_resume_runs_exactly_the_missing_rows(tmp_path):
    """Killed while the second server plays; resumed naming only that server: its missing rows run."""
    tmp, env = _private_tmp(tmp_path)
    out = tmp_path / "r.jsonl"
    both = ["example_multi_step", "example_session_state_mgmt", "--policy", "scripted", "--num-repeats", "100",
            "-o", str(out), "--no-env-yaml"]
    # Killed just after the second server's first rows: 500 rows of margin for a slow poll.
    killed = _kill_at(both, env, out, 510)
    before = Counter(server for server, _, _ in _identities(out))
    assert not killed["finished"], "the run ended before it was killed"
    assert before["example_multi_step"] == 500 and before["example_session_state_mgmt"] < 500
    second = ["example_session_state_mgmt", *both[2:]]
    resumed = _finish(second, env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"500 rollout(s), {500 - before['example_session_state_mgmt']} to run" in resumed.stderr
    identities = _identities(out)
    assert len(identities) == len(set(identities)) == 1000
    again = _finish(both, env)  # nothing is missing any more, from either server
    assert again.returncode == 0 and "1000 rollout(s), 0 to run" in again.stderr, again.stderr[-2000:]
    assert _log_folders(tmp) == []


@pytest.mark.parametrize("concurrency", [1, 16, 256])
def test_kills_at_many_points_with_a_failures_sidecar(tmp_path, concurrency, figures):
    """Two servers, one refusing some rows (their rollouts fail every time): killed at five points."""
    tmp, env = _private_tmp(tmp_path)
    rows = load_rows(bundled_dataset("example_single_tool_call"))
    tasks = [{**row, "agent_ref": {"type": "resources_servers", "name": "example_single_tool_call"}} for row in rows]
    tasks += [{**row, "agent_ref": {"type": "resources_servers", "name": "flaky_seed"}, **({"fail": True} if i < 2 else {})}
              for i, row in enumerate(rows)]
    tasks_path = tmp_path / "tasks.jsonl"
    tasks_path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    repeats = 30
    playable = 8 * repeats  # 2 of the 10 tasks cannot be seeded
    out = tmp_path / "r.jsonl"
    with running_server() as model_url:
        args = ["example_single_tool_call", f"+config_paths=[{FLAKY}]", "--input", str(tasks_path), "--policy",
                "openai", "--base-url", model_url, "--model", f"kill-test-{concurrency}", "--api-key", "test-key-0123",
                "--num-repeats", str(repeats), "--concurrency", str(concurrency), "-o", str(out), "--no-env-yaml"]
        kills = []
        for number, rows_at in enumerate((1, playable // 6, playable * 2 // 5, playable * 2 // 3, playable * 9 // 10)):
            extra = ["--resume"] if number else []
            kills.append(_kill_at([*args, *extra], env, out, rows_at))
        resumed = _finish(args, env)
    failing = 2 * repeats
    assert resumed.returncode == 1 and f"{failing} rollout(s) failed" in resumed.stderr, resumed.stderr[-2000:]
    identities = _identities(out)
    assert len(identities) == len(set(identities)) == playable  # lost 0, duplicated 0
    assert not out.read_bytes() or out.read_bytes().endswith(b"\n")  # no torn line
    summary = summarize(out)
    assert summary["num_rollouts"] == playable and summary["num_failed"] == failing
    assert summary["per_server"]["flaky_seed"]["num_failed"] == failing
    assert all(k["orphans"] == 0 for k in kills)
    assert sum(not k["finished"] for k in kills) >= 4, kills  # the kills really landed mid-run
    assert _log_folders(tmp) == []
    figures.record(f"concurrency {concurrency}: rows at each kill", [k["rows"] for k in kills])


def test_a_resume_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "r.jsonl"
    env = cli_env()
    args = ["example_single_tool_call", "--policy", "scripted", "-o", str(out), "--no-env-yaml"]
    first = subprocess.run([*CLI, "rollouts", *args, "--num-repeats", "2"], env=env, capture_output=True, text=True,
                           timeout=DEADLINE_S, check=False)
    assert first.returncode == 0, first.stderr[-2000:]
    refused = subprocess.run([*CLI, "rollouts", *args, "--num-repeats", "3", "--temperature", "0.5", "--resume"],
                             env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False)
    assert refused.returncode == 1
    assert "--num-repeats was 2, now 3" in refused.stderr and "temperature=0.5" in refused.stderr
    assert "--allow-changes" in refused.stderr and "Traceback" not in refused.stderr
    assert len(_identities(out)) == 10  # nothing was written
    allowed = subprocess.run([*CLI, "rollouts", *args, "--num-repeats", "3", "--resume", "--allow-changes"],
                             env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "10 rollout(s)" not in allowed.stderr and "15 rollout(s), 5 to run" in allowed.stderr
    assert len(set(_identities(out))) == 15
