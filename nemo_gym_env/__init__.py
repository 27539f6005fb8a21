"""NeMo-Gym-compatible resources servers behind the Gymnasium API.

Importing the package registers ``NemoGym/<server>-v0`` for every bundled server and the
generic ``NemoGym/Generic-v0``::

    import gymnasium as gym
    import nemo_gym_env

    env = gym.make("NemoGym/example_multi_step-v0")

One folder per side of the wire (``docs/architecture.md`` shows how they meet):

- ``protocol/``: the wire with no I/O (types, items, model-text parser, datasets, metrics);
- ``client/``: the HTTP transport, the resources-server client, the background event loop;
- ``server/``: what a resources server's ``app.py`` imports (``nemo_gym_env.server``);
- ``launch/``: configs, the bundled catalog, server processes, the head server;
- ``envs/``: the Gymnasium env and vector env;
- ``rollouts/``: collecting rollouts into JSONL; ``policies/``: what plays the model;
- ``ray_cluster/``: scale-out on Ray; ``adapters/``: TRL and NeMo RL; ``cli/``: ``nemo-gym-env``;
- ``system/``: sockets, process groups, the launcher's hand-over, secret redaction (both sides);
- ``viewer/``: the rollout viewer and play pages;
- ``errors``: every public error, under :class:`~nemo_gym_env.errors.NemoGymError`.

The names below load lazily, so server processes, verifier workers and commands that import a
submodule do not pay for the env stack; the ids are registered as soon as ``gymnasium`` is imported,
before or after this package (see :func:`~nemo_gym_env.envs.registration.register_envs_on_gymnasium_import`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.envs.registration import (
    GENERIC_ID,
    env_id,
    register_envs,
    register_envs_on_gymnasium_import,
)
from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.envs.env import NemoGymEnv
    from nemo_gym_env.envs.vector import NemoGymVectorEnv
    from nemo_gym_env.errors import ActionError, NemoGymError, ServerError

__all__ = ["GENERIC_ID", "ActionError", "NemoGymEnv", "NemoGymError", "NemoGymVectorEnv", "ServerError",
           "__version__", "env_id", "register_envs"]

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, {
    "NemoGymEnv": "nemo_gym_env.envs.env",
    "NemoGymVectorEnv": "nemo_gym_env.envs.vector",
    **dict.fromkeys(("ActionError", "NemoGymError", "ServerError"), "nemo_gym_env.errors"),
})

# The ids are registered when gymnasium is imported (at once if it already is): a resources server, a verifier
# worker and most commands never use Gymnasium and skip its import (0.2 s of CPU with numpy, measured).
register_envs_on_gymnasium_import()
