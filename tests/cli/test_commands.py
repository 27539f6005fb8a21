"""``list``, ``config``, ``validate``, ``init``, ``--help`` and argument errors, as real processes."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys

import httpx
import pytest
import yaml

from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers

from .conftest import CANARY, assert_one_line_error, cli_env, read_jsonl, run_cli

COMMANDS = ["serve", "rollouts", "list", "config", "validate", "init"]


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)])
def test_help_everywhere(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: nemo-gym-env")


def test_console_script_is_installed():
    exe = shutil.which("nemo-gym-env")
    if exe is None:
        pytest.skip("the package is not installed (console script missing)")
    result = subprocess.run([exe, "--version"], capture_output=True, text=True, env=cli_env(), timeout=60, check=False)
    assert result.returncode == 0 and result.stdout.startswith("nemo-gym-env ")


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["rollouts", "--bogus"],
        ["rollouts", "--num-repeats", "many"],
        ["validate"],
        ["init"],
        ["init", "2fast"],
        ["init", "class"],
        ["init", "has-dash"],
        ["config", "no_such_server"],
        ["config", "+config_paths=[/no/such.yaml]"],
        ["config", "not a valid=override=[["],
        ["validate", "/no/such/file.jsonl"],
    ],
)
def test_bad_arguments_are_one_line_errors(args, tmp_path):
    assert_one_line_error(run_cli(*args, cwd=tmp_path))


def test_debug_shows_the_traceback(tmp_path):
    result = run_cli("config", "+config_paths=[/no/such.yaml]", "--debug", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" in result.stderr


def test_list_shows_servers_ids_and_tools():
    result = run_cli("list")
    assert result.returncode == 0, result.stderr
    for name in bundled_servers():
        assert name in result.stdout and f"NemoGym/{name}-v0" in result.stdout
    assert "get_weather" in result.stdout and "get_synonym_value, extract_synonym_values" in result.stdout
    listed = json.loads(run_cli("list", "--json").stdout)
    single = next(entry for entry in listed if entry["name"] == "example_single_tool_call")
    assert single == {**single, "env_id": "NemoGym/example_single_tool_call-v0", "tasks": 5, "tools": ["get_weather"]}


def test_config_is_resolved_and_redacted(tmp_path):
    (tmp_path / "env.yaml").write_text(f"policy_base_url: https://example.invalid/v1\npolicy_api_key: {CANARY}\n")
    name = "example_multi_step"
    result = run_cli(
        "config", name, f"+{name}.resources_servers.{name}.judge_url=${{policy_base_url}}",
        f"+{name}.resources_servers.{name}.leak=prefix-${{policy_api_key}}", "+db.password=hunter22",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert CANARY not in result.stdout + result.stderr and "hunter22" not in result.stdout
    doc = yaml.safe_load(result.stdout)
    impl = doc[name]["resources_servers"][name]
    assert impl["judge_url"] == "https://example.invalid/v1"  # resolved
    assert impl["leak"] == "prefix-***REDACTED***"
    assert doc["policy_api_key"] == doc["db"]["password"] == "***REDACTED***"
    assert impl["entrypoint"] == "app.py"

    explicit = run_cli("config", name, f"+policy_api_key={CANARY}", "--no-env-yaml", cwd=tmp_path)
    assert explicit.returncode == 0 and CANARY not in explicit.stdout + explicit.stderr


def test_validate_reports_line_numbers(tmp_path):
    good = bundled_dataset("example_single_tool_call")
    ok = run_cli("validate", str(good))
    assert ok.returncode == 0 and "5 valid row(s), 0 invalid" in ok.stdout
    bad = tmp_path / "bad.jsonl"
    rows = good.read_text().splitlines()
    wrong = json.loads(rows[1])
    wrong["responses_create_params"]["tools"] = "toolz"  # a string where a list of tools belongs
    bad.write_text("\n".join([rows[0], "{oops", '{"x": 1}', json.dumps(wrong)]) + "\n")
    result = run_cli("validate", str(good), str(bad))
    assert result.returncode == 1
    assert f"{bad}:2: not JSON" in result.stderr
    assert f"{bad}:3: missing 'responses_create_params'" in result.stderr
    assert f"{bad}:4: responses_create_params.tools: " in result.stderr
    assert "1 valid row(s), 3 invalid" in result.stdout
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert run_cli("validate", str(empty)).returncode == 1


@pytest.mark.slow
def test_init_scaffold_passes_its_own_tests_and_launches(tmp_path):
    result = run_cli("init", "my_env", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    root = tmp_path / "my_env"
    for relative in ("app.py", "configs/my_env.yaml", "data/example.jsonl", "tests/test_app.py", "README.md"):
        assert (root / relative).is_file(), relative
    assert len(read_jsonl(root / "data" / "example.jsonl")) == 5
    assert run_cli("validate", str(root / "data" / "example.jsonl")).returncode == 0

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=240, check=False,
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout

    # The scaffold runs as the launcher runs every server: `python app.py` in its own process.
    from nemo_gym_env.launch.config import load_config, server_specs
    from nemo_gym_env.launch.launcher import Launcher

    [spec] = server_specs(load_config([root / "configs" / "my_env.yaml"], env_yaml=None))
    with Launcher() as launcher:
        url = launcher.start(spec).url
        reply = httpx.post(f"{url}/add", json={"a": 2, "b": 3}, timeout=10, trust_env=False)
    assert reply.json() == {"sum": 5}

    again = run_cli("init", "my_env", "--dir", str(tmp_path))
    assert_one_line_error(again)
    assert "already exists" in again.stderr


@pytest.mark.slow
@pytest.mark.skipif(not (importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")),
                    reason="the local policy needs torch and transformers")
def test_inits_first_rollouts_advice_runs_offline(tmp_path):
    """The first rollouts command ``init`` advises needs no endpoint: the embedded model plays the new server."""
    made = run_cli("init", "my_env", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    advice = [line.split("#")[0].strip() for line in made.stdout.split("next:\n", 1)[1].splitlines()]
    rollouts = [line for line in advice if line.startswith("nemo-gym-env rollouts")]
    assert "--policy local" in rollouts[0] and "--policy openai" in rollouts[1], advice
    words = shlex.split(rollouts[0])[1:] + ["--limit", "2", "--max-output-tokens", "16"]
    ran = run_cli(*words, cwd=tmp_path, timeout=900)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert len(read_jsonl(tmp_path / "results" / "rollouts.jsonl")) == 2


@pytest.mark.slow
def test_inits_advice_runs_after_the_core_install(tmp_path):
    """After ``pip install nemo-gym-env`` alone (no pytest), the first command ``init`` advises installs what
    its tests need and runs them."""
    from tests.fixtures.installs import linked_venv

    python = linked_venv(tmp_path / "venv", [], with_pip=True)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"  # `python` is the install's, as after activate
    work = tmp_path / "work"
    work.mkdir()
    made = subprocess.run([str(python), "-m", "nemo_gym_env.cli", "init", "my_env"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert made.returncode == 0, made.stderr
    advice = made.stdout.split("next:\n", 1)[1].splitlines()
    assert advice[0].strip() == "python -m pip install pytest && python -m pytest my_env/tests -q"
    tested = subprocess.run(advice[0].strip(), shell=True, cwd=work, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    assert tested.returncode == 0, tested.stdout[-2000:] + tested.stderr[-2000:]
    assert "3 passed" in tested.stdout


def test_rollouts_without_torch_explains_how_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util

    from nemo_gym_env import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "transformers") else real(name, *a))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["rollouts"]) == 1
    err = capsys.readouterr().err
    assert "pip install" in err and "--policy openai" in err and "env.yaml" in err
    assert len(err.strip().splitlines()) == 1
