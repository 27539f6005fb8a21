"""``gym.make``'s entry points (``envs.make``): the embedded server is spawned before the env stack is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

MAKE_ORDER_SCRIPT = """
import sys
import gymnasium as gym
import nemo_gym_env
from nemo_gym_env.launch import launcher
import nemo_gym_env.envs.make
STACK = "nemo_gym_env.envs.env"
assert STACK not in sys.modules and "fastapi" not in sys.modules, "gym.make's entry point imports the env stack"
at_spawn = []
spawn = launcher._spawn
def observed_spawn(*args, **kwargs):
    at_spawn.append(STACK in sys.modules)
    return spawn(*args, **kwargs)
launcher._spawn = observed_spawn
env = gym.make("NemoGym/example_multi_step-v0")
obs, info = env.reset(seed=0)
assert obs and info["tools"]
assert at_spawn == [False], at_spawn
assert STACK in sys.modules and "fastapi" not in sys.modules
assert "openai" not in sys.modules, "the env's wire types are this package's own: no SDK import"
env.close()
"""


def test_make_spawns_the_server_before_importing_the_env_stack():
    """``gym.make`` starts the embedded server first and imports the env's modules while it boots
    (the two overlap); the env process never imports the server stack, nor the ``openai`` SDK."""
    done = subprocess.run([sys.executable, "-c", MAKE_ORDER_SCRIPT], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
