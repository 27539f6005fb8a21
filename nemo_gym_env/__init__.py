"""NeMo-Gym-compatible resources servers behind the Gymnasium API.

Importing the package registers ``NemoGym/<server>-v0`` for every bundled server and the
generic ``NemoGym/Generic-v0``::

    import gymnasium as gym
    import nemo_gym_env

    env = gym.make("NemoGym/example_multi_step-v0")
"""

from __future__ import annotations

from .client import ServerError
from .env import ActionError, NemoGymEnv
from .registration import GENERIC_ID, env_id, register_envs

__all__ = ["NemoGymEnv", "ActionError", "ServerError", "GENERIC_ID", "env_id", "register_envs", "__version__"]

__version__ = "0.1.0"

register_envs()
