"""Which Ray cluster to join, and joining it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from nemo_gym_env.errors import ClusterConnectionError
from nemo_gym_env.system.ray_join import TOKEN_HELP, check_cluster, import_ray, lost_worker_errors

__all__ = ["RAY_ADDRESS_KEY", "TOKEN_HELP", "check_cluster", "connect", "import_ray", "kill_actor", "lost_worker_errors", "ray_address", "remote_class", "remote_message"]

RAY_ADDRESS_KEY = "ray_head_node_address"
"""NeMo Gym's config key for the cluster address (NeMo RL sets it to its GCS address)."""


def ray_address(config: Mapping[str, Any] | None = None, address: str | None = None) -> str | None:
    """The cluster address to use: ``address``, else ``config["ray_head_node_address"]``, else ``RAY_ADDRESS``.

    None means ``ray.init()``'s default: a cluster started on this machine with ``ray start``,
    or a private local one.

    Example:
        >>> ray_address({"ray_head_node_address": "10.0.0.1:6379"})
        '10.0.0.1:6379'
    """
    if address:
        return address
    value = (config or {}).get(RAY_ADDRESS_KEY)
    if isinstance(value, str) and value.strip():
        return value.strip()
    return os.environ.get("RAY_ADDRESS") or None


def connect(address: str | None = None, *, config: Mapping[str, Any] | None = None, **init_kwargs: Any) -> str:
    """Join the cluster (once per process) and return its GCS address.

    Already connected (inside a Ray worker, or after an earlier call): nothing changes, and
    the current cluster's address is returned.

    Args:
        address: The cluster (``host:port``, ``ray://host:10001``, ``auto``).
        config: A config whose ``ray_head_node_address`` names the cluster.
        **init_kwargs: More ``ray.init`` arguments (``runtime_env``, ``namespace``...).

    Raises:
        ClusterConnectionError: Nothing answers at ``host:port``, the cluster wants a token this
            process lacks (or has another), or Ray could not join it; the message says which and
            what to set. (Ray's own error for a missing token, after 20 s, is only "Failed to connect".)
    """
    ray = import_ray()
    if not ray.is_initialized():
        target = ray_address(config, address)
        check_cluster(target)
        try:
            ray.init(address=target, log_to_driver=init_kwargs.pop("log_to_driver", False), **init_kwargs)
        except ConnectionError as exc:
            raise ClusterConnectionError(f"cannot join the Ray cluster at {target or 'the address ray.init finds'}: "
                                         f"{exc}") from exc
    return ray.get_runtime_context().gcs_address


def kill_actor(ray: Any, handle: Any) -> None:
    """``ray.kill`` without restart; nothing if it is already gone."""
    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)


def remote_message(exc: BaseException) -> str:
    """The useful part of an error raised inside an actor or task (Ray wraps it, often twice,
    with a long traceback): the innermost cause's message."""
    cause: BaseException = exc
    while isinstance(getattr(cause, "cause", None), BaseException):
        cause = cause.cause  # type: ignore[attr-defined]
    if cause is not exc:
        return str(cause)
    if getattr(exc, "actor_init_failed", False):  # the actor's __init__ raised: its traceback ends with the error
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return f"{type(exc).__name__}: {exc}"


_REMOTE_CLASSES: dict[type, Any] = {}


def remote_class(cls: type) -> Any:
    """``ray.remote(cls)``, made once per class; ``ray`` is imported on first use, not before."""
    wrapped = _REMOTE_CLASSES.get(cls)
    if wrapped is None:
        wrapped = _REMOTE_CLASSES[cls] = import_ray().remote(cls)
    return wrapped
