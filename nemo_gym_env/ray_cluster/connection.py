"""Which Ray cluster to join, and joining it."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["RAY_ADDRESS_KEY", "connect", "import_ray", "kill_actor", "lost_worker_errors", "ray_address", "remote_class", "remote_message"]

RAY_ADDRESS_KEY = "ray_head_node_address"
"""NeMo Gym's config key for the cluster address (NeMo RL sets it to its GCS address)."""


def import_ray() -> Any:
    """``ray``, or an ImportError saying how to get it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ImportError("scale-out on Ray needs ray: pip install 'nemo-gym-env[ray]'") from None


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
    """
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=ray_address(config, address), log_to_driver=init_kwargs.pop("log_to_driver", False),
                 **init_kwargs)
    return ray.get_runtime_context().gcs_address


def lost_worker_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """What a call on a dead actor raises (its process killed, its node gone)."""
    errors = ray.exceptions
    return (errors.RayActorError, errors.WorkerCrashedError, errors.ObjectLostError, errors.NodeDiedError)


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
