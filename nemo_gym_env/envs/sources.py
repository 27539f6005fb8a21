"""Where an env's server is: a URL, a config, or a bundled server started on loopback.

Light on purpose (no openai, no pydantic models): ``gym.make`` resolves the server through this
module, and spawns an embedded one, before it imports the env's own modules, so that the
server's start-up and those imports overlap (see :mod:`nemo_gym_env.envs.make`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nemo_gym_env.launch.catalog import bundled_dataset, bundled_spec
from nemo_gym_env.launch.config import load_config, server_specs
from nemo_gym_env.launch.shared import acquire_server, release_server

__all__ = ["ServerHandle", "resolve_server"]


@dataclass
class ServerHandle:
    """Where an env's server is, and whether the env holds a shared embedded server."""

    url: str
    name: str
    default_dataset: Path | None
    acquired: str | None

    def release(self) -> None:
        """Give back the shared embedded server, if this handle holds one (idempotent)."""
        if self.acquired is not None:
            release_server(self.acquired)
            self.acquired = None


def resolve_server(
    server: str | None,
    base_url: str | None,
    config_paths: Sequence[str] | None,
    *,
    while_starting: Callable[[], object] | None = None,
) -> ServerHandle:
    """Find or start the server an env talks to: a URL, a config, or a bundled name.

    ``while_starting`` runs while a server this call starts boots (see
    :func:`~nemo_gym_env.launch.shared.acquire_server`).
    """
    if base_url is not None:
        return ServerHandle(base_url.rstrip("/"), server or base_url, None, None)
    if config_paths:
        specs = server_specs(load_config(list(config_paths), env_yaml=None))
        if server is not None:
            specs = [s for s in specs if server in (s.instance_name, s.impl_name)]
        if len(specs) != 1:
            raise ValueError(f"config_paths define {len(specs)} matching resources servers; name one with server=...")
        spec, default = specs[0], None
    elif server is not None:
        spec, default = bundled_spec(server), bundled_dataset(server)
    else:
        raise ValueError("give a bundled server name, a base_url, or config_paths")
    process = acquire_server(spec, while_starting=while_starting)
    return ServerHandle(process.url, spec.instance_name, default, spec.instance_name)
