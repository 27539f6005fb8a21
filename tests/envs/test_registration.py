"""The ``NemoGym/*`` ids (``envs.registration``): which ids, their kwargs and entry points, and deferred registration in a server process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym

import nemo_gym_env
from nemo_gym_env.launch.child_env import SERVER_ENV

from ..conftest import BUNDLED

REPO = Path(__file__).resolve().parents[2]


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
