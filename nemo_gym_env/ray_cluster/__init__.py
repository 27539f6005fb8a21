"""Scale-out on a Ray cluster: servers placed on nodes, rollouts spread over Ray workers.

- :func:`connect` joins the cluster named by ``ray_head_node_address`` (NeMo Gym's key), an
  explicit address, ``RAY_ADDRESS``, or ``ray.init()``'s defaults.
- :class:`RayLauncher` starts resources servers on cluster nodes (one Ray actor per server,
  running the server as a process on that node's address) with :class:`~nemo_gym_env.launch.launcher.Launcher`'s
  surface, so :class:`~nemo_gym_env.launch.head_server.HeadServer` reports them like local ones.
- :func:`ray_collect` shards rollouts over Ray workers, each with its own event loop, and
  streams the rows back in (task, rollout) order; the unfinished episodes of a worker that
  dies run again on another, and no row is yielded twice.
- :class:`RayVectorEnv` is a Gymnasium vector env whose sub-envs are split over Ray workers,
  each running a :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv` of its shard on its own event
  loop; a worker that dies is replaced and its episodes start over.

Importing this package does not import ``ray`` (the ``ray`` extra); using it does. See
``docs/scale_out.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.errors import WorkersLost
    from nemo_gym_env.ray_cluster.collect import ray_collect
    from nemo_gym_env.ray_cluster.connection import connect, ray_address
    from nemo_gym_env.ray_cluster.servers import RayLauncher, RayServer
    from nemo_gym_env.ray_cluster.vector import RayVectorEnv

__all__ = ["RayLauncher", "RayServer", "RayVectorEnv", "WorkersLost", "connect", "ray_address", "ray_collect"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "WorkersLost": "nemo_gym_env.errors",
    "ray_collect": "nemo_gym_env.ray_cluster.collect",
    **dict.fromkeys(("connect", "ray_address"), "nemo_gym_env.ray_cluster.connection"),
    **dict.fromkeys(("RayLauncher", "RayServer"), "nemo_gym_env.ray_cluster.servers"),
    "RayVectorEnv": "nemo_gym_env.ray_cluster.vector",
})
