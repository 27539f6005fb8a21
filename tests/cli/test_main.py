"""``cli/main.py``: the command table; each command's arguments live in its own module, imported only when named."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from nemo_gym_env.cli.main import COMMANDS, build_parser

from .conftest import cli_env

# What `--help` must not import (measured in benchmarks/cli_help.py: these are most of a command's start-up).
HEAVY = ["openai", "pydantic", "fastapi", "torch", "httpx", "nemo_gym_env.protocol.types"]


def _imported_by(*argv: str) -> list[str]:
    """The modules a fresh interpreter holds after ``nemo-gym-env ARGV``."""
    code = ("import json, sys\nfrom nemo_gym_env.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\nprint(json.dumps(sorted(sys.modules)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=cli_env(),
                          timeout=120, check=False)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_declares_its_arguments_and_its_run_in_its_own_module(name, capsys):
    module = importlib.import_module(COMMANDS[name][0])
    assert callable(getattr(module, f"{name}_arguments")) and callable(getattr(module, f"cmd_{name}"))
    parser = build_parser([name])
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args([name, "--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser([]).parse_args([name, "--help"])  # the stub: the help line, -h and --debug only
    stub = capsys.readouterr().out
    assert shown.startswith(f"usage: nemo-gym-env {name}") and "--debug" in shown
    assert len(shown.splitlines()) > len(stub.splitlines()), shown  # its own options and description


def test_the_top_level_help_lists_every_command_and_imports_none_of_them():
    modules = _imported_by("--help")
    assert not [m for m in modules if m.startswith("nemo_gym_env.cli.") and m != "nemo_gym_env.cli.main"
                and m != "nemo_gym_env.cli.common"], modules
    assert not [m for m in HEAVY if m in modules]
    done = subprocess.run([sys.executable, "-m", "nemo_gym_env.cli", "--help"], capture_output=True, text=True,
                          env=cli_env(), timeout=120, check=False)
    assert done.returncode == 0
    for name, (_, line) in COMMANDS.items():
        assert name in done.stdout and line.split()[0] in done.stdout


def test_a_commands_help_imports_its_module_only_and_nothing_the_run_needs():
    modules = _imported_by("rollouts", "--help")
    cli_modules = {m for m in modules if m.startswith("nemo_gym_env.cli.")}
    assert cli_modules == {"nemo_gym_env.cli.main", "nemo_gym_env.cli.common", "nemo_gym_env.cli.rollouts"}
    assert not [m for m in [*HEAVY, "nemo_gym_env.rollouts.runner", "nemo_gym_env.rollouts.plan"] if m in modules]
    # Options before the command are the top-level ones; the command is still found.
    assert "nemo_gym_env.cli.rollouts" in _imported_by("--debug", "rollouts", "--help")


def test_building_every_command_gives_the_same_parser_a_named_command_gets():
    every, one = build_parser(), build_parser(["rollouts"])
    argv = ["rollouts", "example_multi_step", "+x=1", "--policy", "scripted", "--num-repeats", "2"]
    a, b = every.parse_args(argv), one.parse_args(argv)
    assert vars(a) == vars(b) and a.run is b.run and a.num_repeats == 2


def test_a_command_whose_module_does_not_import_is_one_line(monkeypatch, capsys):
    """An install that lacks what a command needs: the command's import fails in one line, as any error does."""
    from nemo_gym_env.cli.main import main

    monkeypatch.setitem(sys.modules, "nemo_gym_env.cli.check", None)  # its import fails
    assert main(["check", "guess_number"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nemo-gym-env: error: ModuleNotFoundError:") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2  # the error, then "(run with --debug for the traceback)"
    assert main(["--debug", "check", "guess_number"]) == 1
    assert "Traceback" in capsys.readouterr().err
