"""Which Ray cluster to join, and joining it."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import ClusterConnectionError

__all__ = ["RAY_ADDRESS_KEY", "TOKEN_HELP", "check_cluster", "connect", "import_ray", "kill_actor", "lost_worker_errors", "ray_address", "remote_class", "remote_message"]

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


_HOST_PORT = re.compile(r"^\[?[\w.:-]+?\]?:\d+$")
TOKEN_HELP = ("every node, driver and `ray` command of a cluster started with token authentication needs "
              "RAY_AUTH_MODE=token and the cluster's token: RAY_AUTH_TOKEN=<token> (`ray get-auth-token` on the head "
              "prints it) or the file ~/.ray/auth_token, set before Ray is imported")


def check_cluster(address: str | None, timeout_s: float = 5.0) -> None:
    """Fail fast, and say why, when the cluster at ``host:port`` cannot be joined by this process.

    Checks that something listens there, then asks its GCS for the cluster id, which is where a
    missing or wrong token shows. Other address forms (``auto``, ``ray://...``, None) are left to Ray.

    Raises:
        ClusterConnectionError: Nothing listens, or the token is missing or not the cluster's.
    """
    if not address or not _HOST_PORT.match(address):
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ClusterConnectionError(
            f"nothing answers at the Ray cluster address {address} ({exc}): start the head there "
            f"(`ray start --head --port={port}`), or fix the address (the address argument, "
            "ray_head_node_address, RAY_ADDRESS)") from None
    mode = os.environ.get("RAY_AUTH_MODE")
    has_token = any(os.environ.get(k) for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")) or \
        (Path.home() / ".ray" / "auth_token").is_file()
    if (mode or "").lower() == "token" and not has_token:  # Ray aborts the whole process (a C++ check) on this
        raise ClusterConnectionError(f"cannot join the Ray cluster at {address}: this process has RAY_AUTH_MODE=token "
                                     f"but no token: {TOKEN_HELP}")
    ray = import_ray()
    try:
        client = ray._raylet.GcsClient  # the GCS client of `ray status`: it reports the token error at once
    except AttributeError:  # another Ray version: ray.init will say what it says
        return
    try:
        client(address=address)
    except ray.exceptions.AuthenticationError:
        if (mode or "").lower() != "token":
            why = f"this process has RAY_AUTH_MODE={mode!r}" if mode else "this process has no RAY_AUTH_MODE set"
        else:
            why = "the token this process has is not the cluster's"
        raise ClusterConnectionError(f"the Ray cluster at {address} requires token authentication and {why}: "
                                     f"{TOKEN_HELP}") from None
    except Exception:  # noqa: BLE001 - anything else is ray.init's to report
        return


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
