"""The ``NemoGym/*`` ids (``envs.registration``): which ids, their kwargs and entry points, and
registration deferred in a server process until ``gymnasium`` is imported (checked in subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.envs.registration import load_env_creator

import nemo_gym_env
from nemo_gym_env.envs import make
from nemo_gym_env.envs.registration import GENERIC_ID, HOSTED_IDS, MIXTURE_ID, env_id, register_envs
from nemo_gym_env.system.child_env import SERVER_ENV

from ..conftest import BUNDLED

REPO = Path(__file__).resolve().parents[2]


def run_python(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def without_server_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != SERVER_ENV}


def test_ids_are_the_generic_one_then_one_per_bundled_server_then_the_hosted_ones_then_the_mixture():
    assert env_id("example_multi_step") == "NemoGym/example_multi_step-v0"
    assert GENERIC_ID == "NemoGym/Generic-v0" and MIXTURE_ID == "NemoGym/Mixture-v0"
    assert list(HOSTED_IDS) == ["NemoGym/Gymnasium-v0", "NemoGym/TextArena-v0"]
    assert register_envs() == [GENERIC_ID, *(env_id(name) for name in BUNDLED), *HOSTED_IDS, MIXTURE_ID]
    assert sorted(name for name in gym.registry if name.startswith("NemoGym/")) == sorted(register_envs())


def test_registering_again_changes_nothing():
    before = {name: gym.spec(name) for name in register_envs()}
    assert register_envs() == list(before)
    assert all(gym.spec(name) is spec for name, spec in before.items())


@pytest.mark.parametrize("server", [None, *BUNDLED])
def test_entry_points_and_plain_json_kwargs(server):
    spec = gym.spec(GENERIC_ID if server is None else env_id(server))
    assert spec.entry_point == "nemo_gym_env.envs.make:make_env"
    assert spec.vector_entry_point == "nemo_gym_env.envs.make:make_vector_env"
    assert load_env_creator(spec.entry_point) is make.make_env
    assert load_env_creator(spec.vector_entry_point) is make.make_vector_env
    assert spec.kwargs == ({} if server is None else {"server": server})
    assert json.loads(json.dumps(spec.kwargs)) == spec.kwargs  # picklable and printable as is
    assert spec.nondeterministic is (server == "code_gen")


def test_every_bundled_server_has_a_registered_id():
    for server in BUNDLED:
        assert nemo_gym_env.env_id(server) in gym.registry
    assert nemo_gym_env.GENERIC_ID in gym.registry


SERVER_PROCESS_SCRIPT = """
import sys
import nemo_gym_env.server
assert "gymnasium" not in sys.modules, "a launched server imported gymnasium"
import gymnasium as gym
assert nemo_gym_env.env_id("example_multi_step") in gym.registry and nemo_gym_env.GENERIC_ID in gym.registry
"""


def test_launched_server_process_registers_the_ids_only_once_gymnasium_is_imported():
    env = {**os.environ, SERVER_ENV: "{}"}
    done = subprocess.run([sys.executable, "-c", SERVER_PROCESS_SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


DEFERRED_SCRIPT = """
import sys
import nemo_gym_env
assert "gymnasium" not in sys.modules, "importing nemo_gym_env in a server process imported gymnasium"
import nemo_gym_env.server.base
assert "gymnasium" not in sys.modules, "the server stack imported gymnasium"
import gymnasium as gym
ids = [i for i in gym.registry if i.startswith("NemoGym/")]
assert sorted(ids) == sorted(nemo_gym_env.register_envs()), ids
"""


def test_in_a_server_process_the_ids_appear_when_gymnasium_is_imported():
    done = run_python(DEFERRED_SCRIPT, {**without_server_env(), SERVER_ENV: "{}"})
    assert done.returncode == 0, done.stderr[-3000:]


def test_in_a_server_process_that_already_imported_gymnasium_the_ids_appear_at_once():
    script = ("import gymnasium as gym\nimport nemo_gym_env\n"
              "assert nemo_gym_env.GENERIC_ID in gym.registry and 'NemoGym/math-v0' in gym.registry")
    done = run_python(script, {**without_server_env(), SERVER_ENV: "{}"})
    assert done.returncode == 0, done.stderr[-3000:]


def test_outside_a_server_process_the_ids_appear_when_gymnasium_is_imported_and_commands_skip_it(tmp_path):
    """The package does not import gymnasium (a command that never uses it skips 0.2 s of imports); the ids
    are there as soon as gymnasium is imported, as a user's ``import gymnasium as gym`` does."""
    script = ("import importlib.util, sys\nimport nemo_gym_env\nassert 'gymnasium' not in sys.modules\n"
              "assert importlib.util.find_spec('gymnasium') is not None  # asking whether it is there imports nothing\n"
              "assert 'gymnasium' not in sys.modules\n"
              "import gymnasium as gym\nassert 'NemoGym/example_multi_step-v0' in gym.registry")
    done = run_python(script, without_server_env())
    assert done.returncode == 0, done.stderr[-3000:]
    rows = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nemo_gym_env.cli", "rollouts", "example_multi_step",
                           "--policy", "scripted", "--limit", "1", "-o", str(rows)], cwd=tmp_path,
                          env=without_server_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and rows.is_file(), done.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "nemo_gym_env" in imported and "gymnasium" not in imported
