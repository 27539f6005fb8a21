"""NeMo-Gym-compatible resources servers behind the Gymnasium API.

Importing the package registers ``NemoGym/<server>-v0`` for every bundled server and the
generic ``NemoGym/Generic-v0``::

    import gymnasium as gym
    import nemo_gym_env

    env = gym.make("NemoGym/example_multi_step-v0")

The env classes load lazily, so server processes and verifier workers that import a
submodule do not pay for the env stack; in a server process started by the launcher the ids
are registered only once ``gymnasium`` is imported (see
:func:`~nemo_gym_env.registration.register_envs_on_gymnasium_import`).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .registration import GENERIC_ID, env_id, register_envs, register_envs_on_gymnasium_import
from .sessions import SERVER_ENV as _SERVER_ENV

__all__ = ["NemoGymEnv", "NemoGymVectorEnv", "ActionError", "ServerError", "GENERIC_ID", "env_id",
           "register_envs", "__version__"]

__version__ = "0.1.0"

_LAZY = {
    "NemoGymEnv": ".env",
    "ActionError": ".actions",
    "ServerError": ".client",
    "NemoGymVectorEnv": ".vector",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'nemo_gym_env' has no attribute {name!r}")


if os.environ.get(_SERVER_ENV) is None:
    register_envs()
else:  # a launched resources server: it serves without Gymnasium
    register_envs_on_gymnasium_import()
