"""Every extra an install line names exists, spelled as pip looks it up (PEP 685), and holds what its commands need.

pip normalizes a requested extra (``reasoning_gym`` -> ``reasoning-gym``) and compares it with the
normalized names the package declares; a name that matches none is skipped with only a warning,
and its dependencies are silently missing. And an extra that exists can still lack a dependency
its command needs only at run time (transformers loads a GGUF file only with ``accelerate``):
each extra's commands run in a virtualenv that holds exactly that extra's install
(:mod:`tests.fixtures.installs`: linked from this environment, nothing downloaded).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# ".[a,b]", 'nemo-gym-env[a]', "/path/to/nemo_gym_env'[a]'" on a line that runs pip
_NAMED = re.compile(r"""(?:\.|nemo-gym-env|nemo_gym_env)['"]?\[([A-Za-z0-9_.,\- ]+)\]""")


def normalized(name: str) -> str:
    """PEP 685 (and PEP 503): runs of ``-``, ``_`` and ``.`` become one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _documents() -> list[Path]:
    found = [REPO / "README.md", REPO / ".ci" / "run", *sorted((REPO / "docs").rglob("*.md"))]
    for folder in ("servers", "recipes", "benchmarks", "examples", "nemo_gym_env", "adapters"):
        found += sorted(p for p in (REPO / folder).rglob("*") if p.suffix in (".md", ".py", ".yaml"))
    return [p for p in found if p.is_file()]


def _named_extras() -> list[tuple[str, str]]:
    named = []
    for path in _documents():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "pip install" in line:
                for group in _NAMED.findall(line):
                    named += [(f"{path.relative_to(REPO)}:{number}", e.strip()) for e in group.split(",")]
    return named


def test_the_readme_names_extras_at_all():
    places = {where.split(":")[0] for where, _ in _named_extras()}
    assert "README.md" in places  # .ci/run runs the README's commands (tests/test_readme_commands.py)


def test_declared_extras_are_in_their_normalized_form():
    assert [name for name in EXTRAS if name != normalized(name)] == []


@pytest.mark.parametrize("where,extra", _named_extras())
def test_every_extra_named_in_an_install_line_exists(where, extra):
    assert extra == normalized(extra), f"{where}: write {normalized(extra)!r}, the name pip looks up"
    assert extra in EXTRAS, f"{where}: no extra {extra!r} in pyproject.toml (it has {', '.join(EXTRAS)})"


def test_extras_that_name_other_extras_name_existing_ones():
    for name, requirements in EXTRAS.items():
        for requirement in requirements:
            match = re.match(r"nemo-gym-env\[([^\]]+)\]", requirement)
            for extra in (match.group(1).split(",") if match else []):
                assert extra.strip() in EXTRAS and extra.strip() == normalized(extra), (name, extra)


def _distribution(requirement: str) -> str:
    return normalized(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0))


def _closure(extra: str) -> set[str]:
    """The distributions ``pip install -e ".[extra]"`` brings in by name (extras of extras followed)."""
    found = {_distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        seen.add(name)
        for requirement in EXTRAS[name]:
            inner = re.match(r"nemo-gym-env\[([^\]]+)\]", requirement)
            if inner:
                todo += [e.strip() for e in inner.group(1).split(",") if e.strip() not in seen]
            else:
                found.add(_distribution(requirement))
    return found


def _core_dependencies_own() -> set[str]:
    """What the core install's dependencies themselves require (fastapi -> starlette), as installed here."""
    found = set()
    for requirement in PYPROJECT["project"]["dependencies"]:
        for inner in importlib.metadata.requires(_distribution(requirement)) or []:
            if "extra ==" not in inner:
                found.add(_distribution(inner))
    return found


MCP_CODE = [*sorted((REPO / "nemo_gym_env" / "server").glob("mcp_*.py")), *sorted((REPO / "servers" / "git_history").glob("*.py"))]


def _third_party_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    tops = {name.split(".")[0] for name in names}
    return {t for t in tops if t not in sys.stdlib_module_names and t not in ("nemo_gym_env", "__future__")}


def test_the_mcp_extra_holds_every_distribution_the_mcp_code_imports():
    """What ``nemo_gym_env/server/mcp_*.py`` and the bundled git_history import is named in the
    ``mcp`` extra or comes with the core install (its dependencies and theirs: fastapi's starlette),
    not only as another extra's dependency; the MCP server git_history starts is in the extra too."""
    assert MCP_CODE and any(p.name == "mcp_expose.py" for p in MCP_CODE)
    owners = importlib.metadata.packages_distributions()
    modules = set().union(*(_third_party_modules(p) for p in MCP_CODE))
    assert "mcp" in modules and "mcp_types" in modules
    unknown = sorted(m for m in modules if m not in owners)
    assert not unknown, f"not installed here (is the venv the README's `.[dev]`?): {unknown}"
    needed = {normalized(d) for m in modules for d in owners[m]}
    declared = _closure("mcp") | _core_dependencies_own()
    assert needed - declared == set(), f"imported but not in the core install or the mcp extra: {needed - declared}"
    assert "mcp-server-git" in declared


def test_the_readme_test_venv_gets_the_real_mcp_servers_the_tests_wrap():
    """``pip install -e ".[dev]"`` (the README's test command) brings the MCP SDK and the three MCP
    servers from PyPI, so the MCP tests run in CI instead of skipping."""
    assert {"mcp", "mcp-server-git", "mcp-server-time", "mcp-server-fetch"} <= _closure("dev")


# ---- each extra runs its commands with only what it installs -----------------------------------

MAIN_JOB = next(line for line in (REPO / "README.md").read_text().splitlines()
                if "pip install" in line and line.rstrip().endswith("nemo-gym-env rollouts"))
MAIN_JOB_EXTRAS = tuple(_NAMED.search(MAIN_JOB).group(1).split(","))
"""The extras of the README's main-job install line (``.[local,math,reasoning-gym]``)."""

PROBES: dict[tuple[str, ...], list[list[str]]] = {
    (): [["-m", "nemo_gym_env.cli", "rollouts", "example_single_tool_call", "--policy", "scripted", "--limit", "1"],
         ["-c", "import gymnasium as gym, nemo_gym_env; env = gym.make('NemoGym/example_multi_step-v0'); "
                "env.reset(seed=0); env.close()"]],
    # The README's main job in miniature: the embedded model converted from its GGUF file (a fresh
    # cache), a task of each server whose verifier comes from an extra.
    MAIN_JOB_EXTRAS: [["-m", "nemo_gym_env.cli", "rollouts", "example_single_tool_call", "math", "reasoning_gym",
                       "--limit", "1", "--max-output-tokens", "4", "--max-steps", "1"]],
    ("trl",): [["-c", "from trl import GRPOConfig, GRPOTrainer; "
                      "from nemo_gym_env.adapters.trl import nemo_gym_rollout_func, tasks_dataset"]],
    ("ray",): [["-c", "import ray; from nemo_gym_env.ray_cluster import RayVectorEnv, ray_collect"]],
    ("textarena",): [["-m", "nemo_gym_env.cli", "rollouts", "textarena_tower_of_hanoi", "--policy", "scripted",
                      "--limit", "1"]],
    ("mcp",): [["-m", "nemo_gym_env.cli", "rollouts", "git_history", "--policy", "scripted", "--limit", "1"],
               ["-c", "from nemo_gym_env.server.mcp_bridge import McpResourcesServer; "
                      "from nemo_gym_env.server.mcp_expose import expose_over_mcp"]],
    ("bench",): [*([str(REPO / "benchmarks" / name), "--help"] for name in ("main_job.py", "throughput.py")),
                 ["-c", "import matplotlib.pyplot, psutil, pyinstrument, aiohttp"]],
    ("test",): [["-m", "pytest", "--version"], ["-c", "import hypothesis, schemathesis, playwright.sync_api"]],
}
"""Per install (its extras): commands its users run. ``vllm`` needs a GPU build of torch; ``dev`` is all of them."""


def test_every_extra_a_document_names_has_its_commands_probed():
    probed = {extra for extras in PROBES for extra in extras}
    named = {extra for _, extra in _named_extras()} - {"dev", "vllm"}
    assert named <= probed, f"no probe for {sorted(named - probed)}"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the local model's conversion and a rollout on each server, on 2 loaded cores
@pytest.mark.parametrize("extras", list(PROBES), ids=lambda e: ",".join(e) or "core")
def test_each_install_runs_its_commands_with_only_what_it_holds(extras, tmp_path):
    from tests.fixtures.installs import linked_venv

    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if "local" in extras:  # an empty model cache but for the GGUF file: the conversion runs, as on a fresh machine
        from nemo_gym_env.policies.models import default_gguf_path, default_model_dir

        default_model_dir()
        cache = tmp_path / "cache"
        env["NEMO_GYM_ENV_CACHE"] = str(cache)
        gguf = default_gguf_path()
        target = cache / gguf.parent.name / gguf.name
        target.parent.mkdir(parents=True)
        shutil.copy(gguf, target)
    python = linked_venv(tmp_path / "venv", list(extras))
    for command in PROBES[extras]:
        done = subprocess.run([str(python), *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        assert done.returncode == 0, f"pip install 'nemo-gym-env[{','.join(extras)}]' then {command}:\n{done.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_with_no_server_named_leaves_out_what_this_install_cannot_start(tmp_path):
    """The core install has none of ``math``, ``reasoning-gym``, ``textarena``: ``rollouts`` with no
    server named starts none of the servers that need them, says which it left out and what to install, and
    plays the other judged servers."""
    from nemo_gym_env.launch.catalog import bundled_servers, bundled_spec
    from tests.fixtures.installs import linked_venv

    needs = {n: bundled_spec(n).config.get("requires") for n in bundled_servers()}
    needs = {n: extra for n, extra in needs.items() if extra}
    assert needs.get("math") == "math" and needs.get("reasoning_gym") == "reasoning-gym", needs
    assert "textarena" in needs.values(), needs
    assert set(needs.values()) <= set(EXTRAS), f"a config `requires` an extra pyproject.toml lacks: {needs}"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    python = linked_venv(tmp_path / "venv", [])
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([str(python), "-m", "nemo_gym_env.cli", "rollouts", "--policy", "scripted", "--limit", "1",
                           "-o", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.stderr
    for name, extra in needs.items():
        assert f"{name} (needs pip install 'nemo-gym-env[{extra}]')" in said, said
    played = {json.loads(line)["agent_ref"]["name"] for line in out.read_text().splitlines()}
    assert played and not played & set(needs), played
    assert {"example_single_tool_call", "guess_number", "mcqa"} <= played, played
