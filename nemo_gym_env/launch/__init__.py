"""The launch side: configs, the bundled catalog, server processes, the head server.

- :mod:`~nemo_gym_env.launch.config`: NeMo Gym's YAML configs, merged with its precedence;
- :mod:`~nemo_gym_env.launch.catalog`: the bundled servers and their example data;
- :mod:`~nemo_gym_env.launch.launcher`: :class:`Launcher` runs each server as its own process
  on a socket it bound, restarts it, and stops it with its whole process group;
- :mod:`~nemo_gym_env.launch.shared`: the process-wide servers behind ``gym.make``;
- :mod:`~nemo_gym_env.launch.head_server`: the head server (where every server is, never a secret);
- :mod:`~nemo_gym_env.launch.logs`: log folders and log streaming.

Sockets, process groups, what a launcher hands its children and keeping secrets out of
everything are :mod:`nemo_gym_env.system`'s: both sides of the wire use them.

Example:
    >>> from nemo_gym_env.launch import Launcher, bundled_spec
    >>> with Launcher() as launcher:                                      # doctest: +SKIP
    ...     print(launcher.start(bundled_spec("example_multi_step")).url)
    http://127.0.0.1:41234
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.errors import ConfigError, LaunchError, ServerCrashed, UnknownServerError
    from nemo_gym_env.launch.catalog import (
        bundled_config_path,
        bundled_dataset,
        bundled_servers,
        bundled_spec,
    )
    from nemo_gym_env.launch.config import ServerSpec, load_config, server_specs, to_yaml
    from nemo_gym_env.launch.entrypoint import resolve_entrypoint
    from nemo_gym_env.launch.head_server import HeadServer, public_config
    from nemo_gym_env.launch.launcher import Launcher, ServerProcess
    from nemo_gym_env.launch.shared import acquire_server, release_server, shared_servers

__all__ = [
    "ConfigError",
    "HeadServer",
    "LaunchError",
    "Launcher",
    "ServerCrashed",
    "ServerProcess",
    "ServerSpec",
    "UnknownServerError",
    "acquire_server",
    "bundled_config_path",
    "bundled_dataset",
    "bundled_servers",
    "bundled_spec",
    "load_config",
    "public_config",
    "release_server",
    "resolve_entrypoint",
    "server_specs",
    "shared_servers",
    "to_yaml",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("ConfigError", "LaunchError", "ServerCrashed", "UnknownServerError"), "nemo_gym_env.errors"),
    **dict.fromkeys(("bundled_config_path", "bundled_dataset", "bundled_servers", "bundled_spec"),
                    "nemo_gym_env.launch.catalog"),
    **dict.fromkeys(("ServerSpec", "load_config", "server_specs", "to_yaml"), "nemo_gym_env.launch.config"),
    **dict.fromkeys(("HeadServer", "public_config"), "nemo_gym_env.launch.head_server"),
    **dict.fromkeys(("Launcher", "ServerProcess", "resolve_entrypoint"), "nemo_gym_env.launch.launcher"),
    **dict.fromkeys(("acquire_server", "release_server", "shared_servers"), "nemo_gym_env.launch.shared"),
})
