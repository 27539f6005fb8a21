"""Every example of docs/conversations.md runs as a user runs it, in one folder, in the page's order: its files
written, its Python run, its commands run (``view`` until it serves, then stopped). Then what each left is read:
the scripted rows score 1.0 with the customer speaking, the embedded model played both sides, the recipe's GRPO
step saw the customer answer (slow: loads the model in several processes, one training step)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import CLI, cli_env, read_jsonl
from tests.viewer.conftest import running_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "conversations.md"
REPO = DOC.parents[1]
_BLOCK = re.compile(r"(?:<!-- file: (?P<file>\S+) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.DOTALL)


def blocks() -> list[tuple[str | None, str, str]]:
    return [(m.group("file"), m.group("lang"), m.group("body")) for m in _BLOCK.finditer(DOC.read_text())]


def _run(command: list[str], folder: Path) -> None:
    done = subprocess.run(command, cwd=folder, env={**cli_env(), "HF_HUB_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=1200, check=False)
    assert done.returncode == 0, " ".join(command) + done.stdout[-2000:] + done.stderr[-3000:]


def test_every_example_runs(tmp_path):
    found = blocks()
    for file, _, body in found:
        if file:
            (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / file).write_text(body)
    ran = []
    for file, lang, body in found:
        if file or lang not in ("python", "bash"):
            continue
        if lang == "python":
            _run([sys.executable, "-c", body], tmp_path)
            ran.append("python")
            continue
        for line in body.strip().splitlines():
            words = shlex.split(line)
            if words[:2] == ["nemo-gym-env", "view"]:
                with running_cli(*words[1:], cwd=tmp_path) as viewer:
                    assert viewer.url.startswith("http://127.0.0.1:")
            elif words[0] == "nemo-gym-env":
                _run([*CLI, *words[1:]], tmp_path)
            elif words[:2] == ["python", "-m"]:
                _run([sys.executable, *words[1:]], tmp_path)
            else:
                assert words[:2] == ["python", "recipes/trl_grpo.py"], line
                _run([sys.executable, str(REPO / words[1]), *words[2:]], tmp_path)
            ran.append(words[1])
    assert ran.count("python") == 3 and ran.count("rollouts") == 2 and ran.count("check") == 1
    assert "view" in ran and "recipes/trl_grpo.py" in ran

    scripted = read_jsonl(tmp_path / "talks.jsonl")
    assert len(scripted) == 6 and all(row["reward"] == 1.0 and row["info"]["user_turns"] >= 2 for row in scripted)
    assert len(read_jsonl(tmp_path / "train.jsonl")) == 200 and len(read_jsonl(tmp_path / "heldout.jsonl")) == 50

    # The embedded model as the agent and as the customer: both spoke, each side's tokens counted apart.
    [row] = read_jsonl(tmp_path / "local.jsonl")
    said = row["info"]["conversation"]
    assert [line["role"] for line in said[:3]] == ["user", "agent", "user"] and all(line["text"] for line in said)
    assert row["user_usage"]["output_tokens"] > 0 and row["response"]["usage"]["output_tokens"] > 0

    # The GRPO step: episodes went past their first turn (the customer answered), and TRL counted only the
    # model's tokens as the completion (the customer's carry env_mask 0; tests/adapters/trl/test_rollout.py
    # checks them token by token).
    [step] = [json.loads(line) for line in (tmp_path / "retail_run" / "metrics.jsonl").read_text().splitlines()]
    assert step["env/failed"] == 0.0 and step["env/num_turns"] > 1 and 0.0 <= step["reward"] <= 1.0
    assert step["completions/max_length"] <= 4 * 12
