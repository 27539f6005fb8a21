"""The README's two commands that CI runs as written (``scripts/readme_commands.py``).

``.ci/run`` and ``scripts/first_contact.py`` read them from README.md; these tests make sure
they are found, are one line to paste, and name only extras that pyproject.toml declares.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

_spec = importlib.util.spec_from_file_location("readme_commands", REPO / "scripts" / "readme_commands.py")
readme_commands = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_commands)


def test_the_readme_marks_both_commands_once():
    commands = readme_commands.readme_commands()
    assert sorted(commands) == sorted(readme_commands.NAMES)
    for name, command in commands.items():
        assert command and "\n" not in command, name
        assert command in (REPO / "README.md").read_text(), name


@pytest.mark.parametrize("name", readme_commands.NAMES)
def test_each_command_installs_in_a_fresh_venv_and_names_only_declared_extras(name):
    command = readme_commands.readme_command(name)
    first, *rest = readme_commands.steps(command)
    assert first.startswith("python3 -m venv ") and any("activate" in step for step in rest), command
    extras = readme_commands.named_extras(command)
    assert extras, f"{name}: no pip install -e \".[...]\" step in {command!r}"
    assert [e for e in extras if e not in EXTRAS] == [], f"{name}: pyproject.toml declares {', '.join(EXTRAS)}"


def test_the_main_job_runs_rollouts_and_the_tests_run_pytest():
    assert readme_commands.steps(readme_commands.readme_command("main-job"))[-1].startswith("nemo-gym-env rollouts")
    assert readme_commands.steps(readme_commands.readme_command("tests"))[-1].startswith("python -m pytest")


def test_the_extractor_refuses_missing_doubled_and_multi_line_commands():
    block = "<!-- command: tests -->\n```bash\n{}\n```\n"
    with pytest.raises(readme_commands.CommandNotFound, match="no command marked"):
        readme_commands.readme_command("main-job", block.format("python -m pytest"))
    with pytest.raises(readme_commands.CommandNotFound, match="two commands"):
        readme_commands.readme_commands(block.format("a") + block.format("b"))
    with pytest.raises(readme_commands.CommandNotFound, match="one line"):
        readme_commands.readme_commands(block.format("a &&\nb"))
    assert readme_commands.named_extras('pip install -e ".[local, math]" && pip install -e .') == ["local", "math"]
    assert readme_commands.named_extras("pip install -e .") == []


def test_ci_reads_both_commands_from_the_readme():
    ci = (REPO / ".ci" / "run").read_text()
    assert "scripts/readme_commands.py tests" in ci and "scripts/first_contact.py" in ci
    assert "pip install" not in ci, ".ci/run must not carry its own copy of an install line"
