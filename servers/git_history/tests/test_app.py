"""git_history: its histories, rows and verifier, and the environment through the vector env, the
``rollouts`` command and one GRPO step of the TRL recipe (``gym.make`` on every row, and MCP clients, are
covered with every bundled server in tests/envs and tests/server/test_mcp_expose.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from nemo_gym_env.launch.catalog import bundled_dataset
from nemo_gym_env.protocol.dataset import load_rows
from nemo_gym_env.servers.git_history.history import make_history, write_repo
from nemo_gym_env.servers.git_history.make_dataset import KINDS, main, make_dataset, question
from nemo_gym_env.servers.git_history.scripted import parse_log, scripted_action

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_git")

from nemo_gym_env.servers.git_history.app import normalize, read_answer

REPO_ROOT = Path(__file__).resolve().parents[3]


def _git(path: Path, *args: str) -> str:
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "HOME": str(path), "PATH": os.environ["PATH"]}
    return subprocess.run(["git", *args], cwd=path, env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout


def test_a_history_is_the_same_repository_wherever_it_is_written(tmp_path):
    commits = make_history(11, 6)
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        write_repo(folder, commits)
    assert _git(first, "rev-parse", "HEAD") == _git(second, "rev-parse", "HEAD")  # fixed dates: same hashes
    assert _git(first, "log", "--reverse", "--format=%an|%s").splitlines() == [f"{c.author}|{c.message}"
                                                                               for c in commits]
    changed = [line for line in _git(first, "log", "--reverse", "--format=", "--name-only").splitlines() if line]
    assert changed == [c.path for c in commits]
    assert _git(first, "status", "--porcelain") == ""  # checked out, nothing pending
    with pytest.raises(ValueError, match="num_commits must be in"):
        make_history(0, 99)


def test_rows_are_valid_and_their_answers_come_from_the_history(tmp_path):
    rows = make_dataset(12, seed=5)
    assert load_rows(rows) == rows and [r["kind"] for r in rows[:4]] == list(KINDS)
    for row in rows:
        commits = make_history(row["history_seed"], row["num_commits"])
        question_text = row["responses_create_params"]["input"][-1]["content"]
        target = next((i for i, c in enumerate(commits) if f'"{c.message}"' in question_text), 0)
        assert question(row["kind"], commits, target) == (question_text, row["expected_answer"])
    assert load_rows(bundled_dataset("git_history")) == make_dataset(4, seed=0)  # the example rows
    out = tmp_path / "rows.jsonl"
    assert main(["--size", "3", "--seed", "1", "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == make_dataset(3, seed=1)


def test_answers_are_read_and_compared_exactly():
    assert read_answer("It was \\boxed{Ada Moreau}.") == "Ada Moreau"
    assert read_answer("\\boxed{1} no, \\boxed{2}") == "2" and read_answer("Ada Moreau") == "Ada Moreau"
    assert normalize(' "Ada  MOREAU." ') == normalize("ada moreau") == "ada moreau"
    assert normalize("src/parser.py") != normalize("src/parser.pyc")


def test_the_scripted_player_reads_the_log_and_does_not_need_the_answer():
    log = ("Commit history:\nCommit: aa11\nAuthor: Ben Okafor\nDate: x\nMessage: Fix the lexer\n\n"
           "Commit: bb22\nAuthor: Ada Moreau\nDate: x\nMessage: Add the guide\n\n")
    assert parse_log(log) == [{"hash": "aa11", "author": "Ben Okafor", "message": "Fix the lexer"},
                              {"hash": "bb22", "author": "Ada Moreau", "message": "Add the guide"}]
    row = {"kind": "file", "responses_create_params": {"input": [
        {"role": "user", "content": 'Which file did the commit with the message "Add the guide" change?'}]}}
    history = [{"type": "function_call_output", "call_id": "call_t0_0", "output": log}]
    [show] = scripted_action(row, history)
    assert show["name"] == "git_show" and json.loads(show["arguments"]) == {"repo_path": ".", "revision": "bb22"}
    history.append({"type": "function_call_output", "call_id": "call_t1_0",
                    "output": "commit bb22\n--- /dev/null\n+++ b/docs/guide.md\n@@ -0,0 +1 @@\n"})
    assert "\\boxed{docs/guide.md}" in scripted_action(row, history)[0]["content"][0]["text"]


@pytest.mark.slow
def test_the_vector_env_plays_every_kind_at_once():
    envs = gym.make_vec("NemoGym/git_history-v0", num_envs=4)
    try:
        observations, infos = envs.reset(seed=0, options={"task_indices": [0, 1, 2, 3]})
        rows = envs.unwrapped.get_attr("task")
        histories: list[list] = [[] for _ in range(4)]
        done = [False] * 4
        rewards = [0.0] * 4
        for _ in range(6):
            actions = [None if done[i] else scripted_action(rows[i], histories[i], correct=i != 3) for i in range(4)]
            observations, reward, terminated, truncated, infos = envs.step(actions)
            for i in range(4):
                if done[i]:
                    continue
                histories[i].extend(observations[i])
                if terminated[i] or truncated[i]:
                    assert terminated[i] and not truncated[i], infos
                    done[i], rewards[i] = True, float(reward[i])
            if all(done):
                break
        assert {row["kind"] for row in rows} == set(KINDS)
        assert rewards == [1.0, 1.0, 1.0, 0.0]
    finally:
        envs.close()


@pytest.mark.slow
def test_rollouts_command_with_the_scripted_player(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    done = subprocess.run([sys.executable, "-m", "nemo_gym_env.cli", "rollouts", "git_history", "--policy", "scripted",
                           "--limit", "2", "-o", str(out)], capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1]
    assert all(r["reward"] == 1.0 and r["correct_answer"] for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_one_grpo_step_of_the_trl_recipe(tmp_path):
    pytest.importorskip("trl")
    from nemo_gym_env.policies.models import default_model_dir

    default_model_dir()  # the embedded model, provisioned once
    out = tmp_path / "run"
    command = [sys.executable, str(REPO_ROOT / "recipes" / "trl_grpo.py"), "env=NemoGym/git_history-v0", "steps=1",
               "batch_size=2", "num_generations=2", "max_turns=2", "max_completion_length=24", "torch_threads=1",
               f"output_dir={out}", f"plot={out / 'curve.png'}"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          timeout=1700, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["env/failed"] == 0.0 and metrics[0]["reward"] is not None


@pytest.mark.slow
def test_without_git_the_server_fails_at_start_with_one_clear_line(monkeypatch, tmp_path):
    from nemo_gym_env.errors import LaunchError
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no git (the server runs on sys.executable)
    with Launcher(ready_timeout_s=60) as launcher, pytest.raises(LaunchError) as raised:
        launcher.start(bundled_spec("git_history"))
    assert "git_history needs the git program on PATH" in str(raised.value)
