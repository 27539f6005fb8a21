"""Where an env's server is: a URL, a config, or a bundled server started on loopback.

Light on purpose (no openai, no pydantic models): ``gym.make`` resolves the server through this
module, and spawns an embedded one, before it imports the env's own modules, so that the
server's start-up and those imports overlap (see :mod:`nemo_gym_env.envs.make`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_env.bridge.targets import check_hosted, is_target, target_config
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_spec
from nemo_gym_env.launch.config import load_config, server_specs
from nemo_gym_env.launch.shared import acquire_server, release_server

__all__ = ["ServerHandle", "resolve_server"]


@dataclass
class ServerHandle:
    """Where an env's server is, and whether the env holds a shared embedded server."""

    url: str
    name: str
    default_dataset: Path | list[dict[str, Any]] | None
    """The rows an env plays when it is given none: a bundled server's example file, a hosted env's seeds."""
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
    hosted: dict[str, Any] | None = None,
    num_tasks: int = 1000,
) -> ServerHandle:
    """Find or start the server an env talks to: a URL, a config, a bundled name or a hosted env.

    ``server`` may be ``gymnasium:ENV_ID`` or ``textarena:GAME`` (:mod:`~nemo_gym_env.bridge.targets`),
    with ``hosted`` more keys of its config; its tasks are then ``num_tasks`` rows, one per seed
    from 0. For a bundled name or a config, ``hosted`` (``gym.make``'s ``server_config``) overrides keys
    of the server's config, in a server of its own (the plain one stays shared). ``while_starting``
    runs while a server this call starts boots (see :func:`~nemo_gym_env.launch.shared.acquire_server`).
    """
    if base_url is None and server is not None and is_target(server):
        return _hosted(server, hosted or {}, num_tasks, while_starting)
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
    if hosted:
        spec = dataclasses.replace(spec, instance_name=_variant(spec.instance_name, hosted),
                                   config={**spec.config, **hosted})
    process = acquire_server(spec, while_starting=while_starting)
    return ServerHandle(process.url, spec.instance_name, default, spec.instance_name)


def _variant(instance: str, settings: dict[str, Any]) -> str:
    """The instance name of a server started with ``settings`` over its config (its own shared server)."""
    return instance + "_" + hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _hosted(target: str, settings: dict[str, Any], num_tasks: int,
            while_starting: Callable[[], object] | None) -> ServerHandle:
    from nemo_gym_env.bridge.datasets import example_rows
    from nemo_gym_env.launch.config import ServerSpec

    ((instance, block),) = target_config(target, **settings).items()
    ((impl, config),) = block["resources_servers"].items()
    if settings:  # the shared server of the plain target must not serve this variant
        instance = _variant(instance, settings)
    check_hosted(instance, config)
    rows = example_rows(config, num_tasks)
    process = acquire_server(ServerSpec(instance, "resources_servers", impl, config), while_starting=while_starting)
    return ServerHandle(process.url, instance, rows, instance)
