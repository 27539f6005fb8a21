"""Durability (docs/architecture.md, "Reliability and security"): ``nemo-gym-env rollouts`` killed with SIGKILL at random points, resumed.

A reference run collects every rollout uninterrupted. Then, in several trials (seeded, so a
failure replays), a run is SIGKILLed at a random moment (during start-up, mid-collection, or
once a random number of rows is written), sometimes with a torn last line added as a kill
in the middle of a write would leave, killed again while resuming, and finally resumed to
the end. Its rows must be exactly the reference's, by ``(_ng_task_index,
_ng_rollout_index)``, with the same rewards: nothing lost, nothing twice, and no server left
running by a killed parent.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest

from nemo_gym_env.rollouts.output import failures_path, read_rollouts

from ..cli.conftest import CLI, cli_env, descendants, run_cli, wait_gone
from ..conftest import example_rows

pytestmark = pytest.mark.slow

SERVER = "example_multi_step"
REPEATS = 20
TRIALS = 3
SEED = 20240611


def _tasks(tmp_path: Path) -> Path:
    """The example tasks, two of them with a ground truth the scripted player cannot meet (reward 0)."""
    rows = example_rows(SERVER)
    for index in (1, 3):
        rows[index] = {**rows[index], "expected_synonym_values": list(reversed(rows[index]["expected_synonym_values"]))
                       + [0]}
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _command(tasks: Path, out: Path, *extra: str) -> list[str]:
    return [*CLI, "rollouts", SERVER, "--input", str(tasks), "--policy", "scripted", "--num-repeats", str(REPEATS),
            "--concurrency", "4", "-o", str(out), *extra]


def _rewards(out: Path) -> dict[tuple[int, int], float]:
    rows, _ = read_rollouts(out)
    keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]
    assert len(keys) == len(set(keys)), "duplicated rollouts"
    return {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in rows}


def _rows(out: Path) -> int:
    return out.read_bytes().count(b"\n") if out.exists() else 0


def _kill_at_random(command: list[str], out: Path, rng: random.Random, total: int, first_row_s: float,
                    run_s: float) -> dict:
    """Start ``command``; SIGKILL it at a random point; return what happened."""
    proc = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    how = rng.choice(["during start-up", "after a delay", "after some rows", "after some rows"])
    before = _rows(out)
    if how == "during start-up":
        time.sleep(rng.uniform(0.1, first_row_s))
    elif how == "after a delay":
        time.sleep(rng.uniform(first_row_s, run_s))
    else:
        target = before + rng.randint(1, max(1, (total - before) // 2))
        deadline = time.monotonic() + 120
        while _rows(out) < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    children = descendants(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    torn = rng.random() < 0.5
    if torn and out.exists():  # what a kill in the middle of a write leaves
        with open(out, "ab") as handle:
            handle.write(b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "respo')
    return {"how": how, "rows_before": before, "rows_after": _rows(out), "finished_first": proc.returncode == 0,
            "torn_line_added": torn, "orphans": len(wait_gone(children))}


def test_kill_9_at_random_points_then_resume_equals_an_uninterrupted_run(tmp_path, figures):
    tasks = _tasks(tmp_path)
    reference = tmp_path / "reference.jsonl"
    started = time.monotonic()
    proc = subprocess.Popen(_command(tasks, reference), env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first_row_s = None
    while proc.poll() is None and time.monotonic() - started < 300:
        if first_row_s is None and _rows(reference):
            first_row_s = time.monotonic() - started
        time.sleep(0.01)
    _, stderr = proc.communicate(timeout=60)
    reference_s = time.monotonic() - started
    assert proc.returncode == 0, stderr[-2000:]
    expected = _rewards(reference)
    total = len(expected)
    assert total == 5 * REPEATS and sorted(set(expected.values())) == [0.0, 1.0]
    first_row_s = first_row_s or reference_s / 2

    rng = random.Random(SEED)
    kills = []
    for trial in range(TRIALS):
        out = tmp_path / f"trial{trial}.jsonl"
        for number in range(rng.randint(1, 2)):
            extra = ("--resume",) if number else ()
            kills.append({"trial": trial, **_kill_at_random(_command(tasks, out, *extra), out, rng, total,
                                                                 first_row_s, reference_s)})
            if out.exists():
                rows, _ = read_rollouts(out)  # the complete rows so far hold no duplicate
                keys = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]
                assert len(keys) == len(set(keys)), f"trial {trial}: duplicated rollouts after a kill"
        resumed = subprocess.run(_command(tasks, out, "--resume"), env=cli_env(), capture_output=True, text=True,
                                 timeout=300, check=False)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        got = _rewards(out)
        assert set(got) == set(expected), f"trial {trial}: lost {len(set(expected) - set(got))} rollouts"
        assert got == expected, f"trial {trial}: rewards differ from the uninterrupted run"
        assert not failures_path(out).exists() or not failures_path(out).read_text().strip()
    assert all(k["orphans"] == 0 for k in kills), "a server outlived its killed parent"
    assert any(k["rows_before"] < k["rows_after"] or k["how"] == "after some rows" for k in kills)
    figures.record(f"rollouts per run (5 tasks x {REPEATS} repeats; 2 tasks score 0)", total)
    figures.record("uninterrupted run (first row after)", f"{reference_s:.1f} s ({first_row_s:.1f} s)")
    figures.record("trials / SIGKILLs", f"{TRIALS} / {len(kills)}")
    figures.record("kills", [(k["how"], k["rows_after"]) for k in kills])
    figures.record("torn last lines added", sum(k["torn_line_added"] for k in kills))
    figures.record("rows lost / duplicated / reward mismatches after resume", "0 / 0 / 0")
    figures.record("servers left running by a killed parent", 0)


def test_overrides_after_options_are_accepted():
    """Found while writing this suite: overrides after an option were refused ("unrecognized
    arguments"), since argparse fills the ``nargs="*"`` positional once; fixed in cli.py."""
    result = run_cli("config", "example_single_tool_call", "--no-env-yaml", "+policy_model_name=m")
    assert result.returncode == 0, result.stderr
