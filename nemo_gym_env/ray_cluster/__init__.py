"""Scale-out on a Ray cluster: servers placed on nodes, rollouts spread over Ray workers.

- :func:`connect` joins the cluster named by ``ray_head_node_address`` (NeMo Gym's key), an
  explicit address, ``RAY_ADDRESS``, or ``ray.init()``'s defaults.
- :class:`RayLauncher` starts resources servers on cluster nodes (one Ray actor per server,
  running the server as a process on that node's address) with :class:`~nemo_gym_env.launch.Launcher`'s
  surface, so :class:`~nemo_gym_env.head.HeadServer` reports them like local ones.
- :func:`ray_collect` shards rollouts over Ray workers, each with its own event loop, and
  streams the rows back in (task, rollout) order; the unfinished episodes of a worker that
  dies run again on another, and no row is yielded twice.
- :class:`RayVectorEnv` is a Gymnasium vector env whose sub-envs are split over Ray workers,
  each running a :class:`~nemo_gym_env.vector.NemoGymVectorEnv` of its shard on its own event
  loop; a worker that dies is replaced and its episodes start over.

Importing this package does not import ``ray`` (the ``ray`` extra); using it does. See
``docs/scale_out.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RayLauncher", "RayServer", "RayVectorEnv", "WorkersLost", "connect", "ray_address", "ray_collect"]

_LAZY = {
    "connect": ".connection",
    "ray_address": ".connection",
    "RayLauncher": ".servers",
    "RayServer": ".servers",
    "ray_collect": ".collect",
    "WorkersLost": ".collect",
    "RayVectorEnv": ".vector",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
