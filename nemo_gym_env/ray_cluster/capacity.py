"""Whether what is about to start fits in the cluster, and if not, the numbers that say why.

Ray queues an actor that does not fit and waits, without a word, for CPUs that may never come;
a verifier's Ray task queued behind rollout workers that took every CPU waits until its own
timeout, and every rollout comes back unjudged. So the pieces that start actors (``RayLauncher``,
``ray_collect``, ``RayVectorEnv``) ask :func:`require` first: it waits a few seconds for
resources being given back (workers of a run that just ended), then raises
:class:`~nemo_gym_env.errors.ClusterCapacityError` naming what is needed, what the cluster has,
what holds the rest (placement groups by name: a server's verifier reservation; the servers a
``RayLauncher`` of this process placed) and what to change.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

from nemo_gym_env.errors import ClusterCapacityError
from nemo_gym_env.ray_cluster.connection import import_ray

__all__ = ["free_per_node", "require", "reservations", "spread", "track"]

_EPSILON = 1e-6
_HOLDERS: weakref.WeakSet[Any] = weakref.WeakSet()


def track(launcher: Any) -> None:
    """Name ``launcher``'s servers (its ``servers``: name -> record with ``num_cpus``) in capacity errors."""
    _HOLDERS.add(launcher)


def free_per_node() -> dict[str, dict[str, float]]:
    """Free resources of each alive node (empty when this Ray cannot tell)."""
    ray = import_ray()
    try:
        return dict(ray._private.state.available_resources_per_node())
    except Exception:  # noqa: BLE001 - a private API: placement falls back to taking nodes in turn
        return {}


def reservations() -> list[str]:
    """What holds CPUs or GPUs now, one phrase each: placement groups, and this process's placed servers."""
    ray = import_ray()
    held: list[str] = []
    try:
        table = ray.util.placement_group_table()
    except Exception:  # noqa: BLE001 - the table is for the message only
        table = {}
    for group in table.values():
        if str(group.get("state", "")).upper() != "CREATED":
            continue
        totals: dict[str, float] = {}
        for bundle in (group.get("bundles") or {}).values():
            for key in ("CPU", "GPU"):
                totals[key] = totals.get(key, 0.0) + float(bundle.get(key, 0.0))
        amounts = ", ".join(f"{v:g} {k}" for k, v in totals.items() if v)
        if amounts:
            held.append(f"{amounts} by placement group {group.get('name') or group.get('placement_group_id')!r}")
    for launcher in list(_HOLDERS):
        for server in launcher.servers.values():
            if server.num_cpus:
                held.append(f"{server.num_cpus:g} CPU by server {server.name!r}")
    return held


def _packs(demands: Sequence[tuple[float, float]], nodes: dict[str, dict[str, float]]) -> bool:
    """Whether every demand fits on some node's free resources (first fit, largest first)."""
    room = [[float(n.get("CPU", 0.0)), float(n.get("GPU", 0.0))] for n in nodes.values()]
    for cpus, gpus in sorted(demands, reverse=True):
        slot = next((r for r in room if r[0] + _EPSILON >= cpus and r[1] + _EPSILON >= gpus), None)
        if slot is None:
            return False
        slot[0] -= cpus
        slot[1] -= gpus
    return True


def require(what: str, demands: Sequence[tuple[float, float]], *, wait_s: float = 15.0) -> None:
    """Check that actors needing ``demands`` (``(cpus, gpus)`` each) fit; wait up to ``wait_s`` for them to.

    Raises:
        ClusterCapacityError: They do not fit in the whole cluster, or do not fit in what is free
            after ``wait_s`` seconds; the message gives the numbers and what holds the rest.
    """
    needs = {"CPU": sum(c for c, _ in demands), "GPU": sum(g for _, g in demands)}
    needs = {key: value for key, value in needs.items() if value > _EPSILON}
    if not needs:
        return
    ray = import_ray()
    deadline = time.monotonic() + wait_s
    while True:
        total: dict[str, Any] = ray.cluster_resources()
        free: dict[str, Any] = ray.available_resources()
        short = [key for key, value in needs.items() if free.get(key, 0.0) + _EPSILON < value]
        nodes = free_per_node()
        unpacked = not short and nodes and not _packs(demands, nodes)  # enough in all, but not on any one node
        if not short and not unpacked:
            return
        never = [key for key in short if total.get(key, 0.0) + _EPSILON < needs[key]]
        if never or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    parts = []
    for key in short:
        parts.append(f"{needs[key]:g} {key} needed, the cluster has {float(total.get(key, 0.0)):g} and "
                     f"{float(free.get(key, 0.0)):g} free")
    if unpacked:
        each = sorted({f"{c:g} CPU" + (f" + {g:g} GPU" if g else "") for c, g in demands})
        spread = ", ".join(f"{float(n.get('CPU', 0.0)):g}" for n in nodes.values())
        parts.append(f"{len(demands)} x {' / '.join(each)} do not fit in the free CPUs of the nodes ({spread}): "
                     "each one must fit on a single node")
    held = reservations()
    raise ClusterCapacityError(
        f"{what} cannot fit: {'; '.join(parts)}"
        + (f" (held: {'; '.join(held)})" if held else "")
        + ". Ask for fewer workers or fewer CPUs each (fractions are allowed), give servers fewer verifier "
          "slots (verify_workers, max_concurrent), or add nodes")


def spread(demands: Sequence[tuple[float, float]]) -> list[Any]:
    """A scheduling strategy for each of several actors: the alive nodes in turn, each actor on the next
    node with room for it (soft node affinity: Ray places it elsewhere if that node fills meanwhile).

    Ray's own ``SPREAD`` is best effort and may stack actors on one node while another is idle;
    it is what is returned when this Ray cannot tell the free resources of each node.
    """
    nodes = free_per_node()
    if not nodes:
        return ["SPREAD"] * len(demands)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    room = {node: [float(free.get("CPU", 0.0)), float(free.get("GPU", 0.0))] for node, free in nodes.items()}
    order = sorted(room)
    strategies: list[Any] = []
    turn = 0
    for cpus, gpus in demands:
        for step in range(len(order)):
            node = order[(turn + step) % len(order)]
            if room[node][0] + _EPSILON >= cpus and room[node][1] + _EPSILON >= gpus:
                room[node][0] -= cpus
                room[node][1] -= gpus
                turn += step + 1
                strategies.append(NodeAffinitySchedulingStrategy(node_id=node, soft=True))
                break
        else:
            strategies.append("SPREAD")
    return strategies
