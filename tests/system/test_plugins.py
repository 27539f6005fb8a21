"""A server another package declares (the ``nemo_gym_env.servers`` entry-point group) plays by name.

The test builds a tiny package in a temporary folder (a server written by ``nemo-gym-env init``, a
scripted player, and a second entry point that is broken) into a wheel, ``pip install``s it into a
virtualenv that holds the package with its ``trl`` extra (``tests/fixtures/installs.py``), and runs that
virtualenv's commands: ``rollouts``, ``check``, ``serve``, ``gym.make`` and the TRL recipe take the plugin's
name as a bundled one's, and the broken plugin is named in one line and skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.conftest import CLI, cli_env, read_jsonl

pytestmark = pytest.mark.slow

PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "echo-plugin"
version = "0.1.0"

[project.entry-points."nemo_gym_env.servers"]
echo_env = "echo_plugin.echo_env"
broken_env = "no_such_package.env"

[tool.setuptools.packages.find]
include = ["echo_plugin*"]

[tool.setuptools.package-data]
"*" = ["configs/*.yaml", "data/*.jsonl"]
"""

SCRIPTED = '''
import json
import re

from nemo_gym_env.protocol.scripting import assistant_message, function_call


def scripted_action(row, history, *, correct=True):
    """Add with the tool, then answer the sum (a wrong one with correct=False)."""
    if not history:
        question = row["responses_create_params"]["input"][-1]["content"]
        a, b = (int(number) for number in re.findall(r"-?\\d+", question))
        return [function_call(0, 0, "add", {"a": a, "b": b})]
    total = json.loads(history[-1]["output"])["sum"]
    return [assistant_message(str(total if correct else total + 1))]
'''


@dataclass
class Installed:
    python: Path
    """The virtualenv's interpreter."""
    env: dict[str, str]
    """The environment of a command run in that virtualenv (as after ``activate``)."""

    @property
    def cli(self) -> list[str]:
        return [str(self.python), "-m", "nemo_gym_env.cli"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """The package built as a wheel and pip-installed into a virtualenv holding ``nemo-gym-env[trl]``."""
    from tests.fixtures.installs import linked_venv

    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    (source / "echo_plugin").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT)
    (source / "echo_plugin" / "__init__.py").write_text("")
    done = subprocess.run([*CLI, "init", "echo_env"], cwd=source / "echo_plugin", env=cli_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (source / "echo_plugin" / "echo_env" / "scripted.py").write_text(SCRIPTED)
    wheels = root / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    python = linked_venv(root / "venv", ["trl"] if importlib.util.find_spec("trl") else [], with_pip=True)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1")
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                           *map(str, wheels.glob("*.whl"))], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return Installed(python, env)


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def _skipped(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "skipping the server plugin" in line]


BROKEN = ("nemo-gym-env: skipping the server plugin 'broken_env' (no_such_package.env from echo-plugin): "
          "it does not import (ModuleNotFoundError: No module named 'no_such_package')")


def test_rollouts_and_check_take_the_plugins_name_and_name_the_broken_one(installed, tmp_path):
    done = _run([*installed.cli, "rollouts", "echo_env", "--policy", "scripted", "-o", "rows.jsonl"], installed.env,
                tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_jsonl(tmp_path / "rows.jsonl")
    assert rows and all(row["reward"] == 1.0 for row in rows)
    assert _skipped(done.stderr) == [BROKEN]  # once, in one line, and the rest went on
    done = _run([*installed.cli, "check", "echo_env"], installed.env, tmp_path)
    assert done.returncode == 0 and "echo_env" in done.stdout, done.stdout + done.stderr
    # Without the package on the path the name is unknown, and the message lists what is.
    done = _run([*CLI, "rollouts", "echo_env", "--policy", "scripted", "-o", "none.jsonl"], cli_env(), tmp_path)
    assert done.returncode != 0 and "echo_env" in done.stderr and "retail_support" in done.stderr


def test_gym_make_and_serve_take_the_plugins_name(installed, tmp_path):
    code = textwrap.dedent("""
        import gymnasium as gym
        import nemo_gym_env

        env = gym.make("NemoGym/echo_env-v0")
        obs, info = env.reset(options={"task_index": 0})
        obs, reward, terminated, truncated, info = env.step(
            '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>')
        obs, reward, terminated, truncated, info = env.step("42")
        print(reward, terminated)
        env.close()
    """)
    done = _run([str(installed.python), "-c", code], installed.env, tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["1.0", "True"], done.stdout + done.stderr[-3000:]
    serve = subprocess.Popen([*installed.cli, "serve", "echo_env", "+head_server.port=0"], cwd=tmp_path, env=installed.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, lines = time.monotonic() + 120, []
        assert serve.stdout is not None
        while time.monotonic() < deadline:
            line = serve.stdout.readline()
            lines.append(line)
            if not line or line.startswith("Ctrl-C to stop"):
                break
        assert any(line.split()[:1] == ["echo_env"] and "http://127.0.0.1:" in line for line in lines), lines
    finally:
        serve.terminate()
        serve.wait(60)


def test_a_plugins_layout_problem_is_one_line_and_a_bundled_name_stays_bundled(tmp_path):
    """In process: entry points of a distribution whose metadata is written by hand."""
    dist = tmp_path / "odd_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: odd-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[nemo_gym_env.servers]\nmath = odd_plugin.math\nnot_a_folder = lonely\n"
                                           "half = odd_plugin.half\nbad-name = odd_plugin.half\n")
    (tmp_path / "odd_plugin" / "half").mkdir(parents=True)
    (tmp_path / "odd_plugin" / "half" / "app.py").write_text("")
    (tmp_path / "lonely.py").write_text("")
    code = textwrap.dedent("""
        import json
        from nemo_gym_env.launch.catalog import bundled_servers
        servers = bundled_servers()
        print(json.dumps({name: str(folder) for name, folder in servers.items() if name in ("math", "half")}))
    """)
    env = {**cli_env(), "PYTHONPATH": f"{tmp_path}:{cli_env()['PYTHONPATH']}"}
    done = _run([sys.executable, "-c", code], env, tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert list(found) == ["math"] and not found["math"].startswith(str(tmp_path))  # the bundled math, kept
    assert sorted(_skipped(done.stderr)) == sorted([
        ("nemo-gym-env: skipping the server plugin 'bad-name' (odd_plugin.half from odd-plugin): its name is not "
        "letters, digits and underscores"),
        (f"nemo-gym-env: skipping the server plugin 'half' (odd_plugin.half from odd-plugin): {tmp_path}/odd_plugin/half "
        "lacks configs/half.yaml"),
        ("nemo-gym-env: skipping the server plugin 'math' (odd_plugin.math from odd-plugin): a bundled server has "
        "that name"),
        ("nemo-gym-env: skipping the server plugin 'not_a_folder' (lonely from odd-plugin): it is a module, not a "
        "server package (a folder)"),
    ])


def test_the_trl_recipe_trains_on_the_plugins_name(installed, tmp_path):
    pytest.importorskip("trl")
    from nemo_gym_env.policies.models import default_model_dir

    default_model_dir()  # the embedded model, provisioned once
    out = tmp_path / "run"
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "trl_grpo.py"
    done = subprocess.run([str(installed.python), str(recipe), "env=NemoGym/echo_env-v0", "steps=1", "batch_size=2",
                           "num_generations=2", "max_turns=2", "max_completion_length=24", "torch_threads=1",
                           f"output_dir={out}"], cwd=tmp_path, env=installed.env, capture_output=True, text=True,
                          timeout=1200, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "echo_env" in done.stdout and "5 training tasks" in done.stdout  # the plugin's own example rows
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["env/failed"] == 0.0 and metrics[0]["reward"] is not None
