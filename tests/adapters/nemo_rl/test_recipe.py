"""recipes/nemo_rl/run_grpo.py: ``prepare`` for real, ``train`` against a stand-in NeMo RL checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "recipes" / "nemo_rl" / "run_grpo.py"


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd, check=False)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prepare_writes_rows_naming_the_server(tmp_path: Path) -> None:
    done = run("prepare", "--server", "math", "--out", str(tmp_path), "--validation-fraction", "0.2")
    assert done.returncode == 0, done.stderr
    train, validation = read(tmp_path / "train.jsonl"), read(tmp_path / "validation.jsonl")
    assert (len(train), len(validation)) == (4, 1)
    assert all(row["agent_ref"] == {"type": "resources_servers", "name": "math"} for row in train + validation)
    assert all("expected_answer" in row for row in train)


def test_prepare_skips_bad_rows_by_line(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    good = {"responses_create_params": {"input": "1+1?"}, "expected_answer": "2", "agent_ref": {"name": "mine"}}
    source.write_text("\n".join([json.dumps(good), "not json", json.dumps({"no": "params"}), json.dumps(good)]))
    done = run("prepare", "--input", str(source), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "in.jsonl:2: skipped" in done.stderr and "in.jsonl:3: skipped" in done.stderr
    rows = read(tmp_path / "out" / "train.jsonl") + read(tmp_path / "out" / "validation.jsonl")
    assert [row["agent_ref"]["name"] for row in rows] == ["mine", "mine"]  # an existing agent_ref is kept


def test_train_without_nemo_rl_says_what_to_do(tmp_path: Path) -> None:
    done = run("train", env={"NEMO_RL_DIR": ""}, cwd=tmp_path)
    assert done.returncode != 0
    assert "NeMo RL is not importable" in done.stderr


def test_train_hands_over_to_nemo_rls_runner_with_our_actor(tmp_path: Path) -> None:
    """A stand-in checkout: NeMo RL's module layout and example paths, a runner that reports what it sees."""
    pytest.importorskip("ray")
    root = tmp_path / "RL"
    (root / "examples" / "nemo_gym").mkdir(parents=True)
    (root / "examples" / "nemo_gym" / "grpo_workplace_assistant_nemotron_nano_v2_9b.yaml").write_text("grpo: {}\n")
    (root / "examples" / "nemo_gym" / "run_grpo_nemo_gym.py").write_text(textwrap.dedent("""
        import json, sys
        import nemo_rl.algorithms.grpo as grpo
        config = sys.argv[sys.argv.index("--config") + 1]
        print(json.dumps({"ours": getattr(grpo.spinup_nemo_gym_actor, "_nemo_gym_env", False),
                          "config": open(config).read(), "argv": sys.argv[3:]}))
    """))
    for package in ("nemo_rl", "nemo_rl/environments", "nemo_rl/algorithms"):
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").write_text("")
    stub = "def spinup_nemo_gym_actor(*args, **kwargs):\n    raise AssertionError('NeMo Gym actor')\n"
    (root / "nemo_rl" / "environments" / "nemo_gym.py").write_text(stub)
    (root / "nemo_rl" / "algorithms" / "grpo.py").write_text(
        "from nemo_rl.environments.nemo_gym import spinup_nemo_gym_actor\n")
    done = run("train", "--nemo-rl-dir", str(root), "grpo.max_num_steps=3",
               env={"PYTHONPATH": os.pathsep.join([str(root), str(REPO)])})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ours"] is True
    assert f"defaults: {root}/examples/nemo_gym/grpo_workplace_assistant_nemotron_nano_v2_9b.yaml" in report["config"]
    assert "should_use_nemo_gym: true" in report["config"]
    assert report["argv"] == ["grpo.max_num_steps=3"]
