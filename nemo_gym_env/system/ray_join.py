"""Joining a Ray cluster, the part every layer may need: ``ray`` imported on first use (an optional
dependency), a cluster that cannot be joined said at once and why (:func:`check_cluster`), and
what a call on a lost worker raises. ``ray_cluster.connection`` builds on it; a server's verifier
workers (``server.workers``) use it directly."""

from __future__ import annotations

import importlib
import os
import re
import socket
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import ClusterConnectionError

__all__ = ["TOKEN_HELP", "check_cluster", "import_ray", "lost_worker_errors"]


def import_ray() -> Any:
    """``ray``, or an ImportError saying how to get it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ImportError("scale-out on Ray needs ray: pip install 'nemo-gym-env[ray]'") from None


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
