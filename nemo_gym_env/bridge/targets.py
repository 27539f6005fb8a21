"""``gymnasium:ENV_ID`` and ``textarena:GAME``: other libraries' envs named where a bundled server's name goes.

``nemo-gym-env serve gymnasium:FrozenLake-v1`` (and ``rollouts``, ``play``, ``config``, ``check``)
turns the name into a server config of its own, a resources-server block whose entrypoint is the
bridge's app for that library::

    >>> block = target_config("gymnasium:FrozenLake-v1")
    >>> list(block)
    ['gymnasium_FrozenLake-v1']
    >>> block["gymnasium_FrozenLake-v1"]["resources_servers"]["gymnasium_env"]["env_id"]
    'FrozenLake-v1'

``gymnasium:my_package.envs:MyEnv`` names a user's own ``gymnasium.Env`` class. Hydra overrides
on the same command line set the block's other keys
(``+gymnasium_FrozenLake-v1.resources_servers.gymnasium_env.env_kwargs.is_slippery=false``).
:func:`check_hosted` builds the server once in the calling process, so a wrong id, a module that
does not import, or a game that needs the network fails there, in one line, before anything starts.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import ConfigError

__all__ = ["LIBRARIES", "check_hosted", "instance_name", "is_hosted", "is_target", "split_target", "target_config"]

APPS = Path(__file__).resolve().parent / "apps"

LIBRARIES: dict[str, tuple[str, str, str]] = {
    "gymnasium": ("gymnasium_env", "env_id", "gymnasium_app.py"),
    "textarena": ("textarena_game", "game", "textarena_app.py"),
}
"""Library prefix -> (implementation name, the config key the name after the prefix sets, entrypoint)."""


def is_target(name: str) -> bool:
    """Whether ``name`` is ``<library>:<id>`` of a library the bridge hosts."""
    prefix, sep, rest = name.partition(":")
    return bool(sep) and prefix in LIBRARIES and bool(rest)


def split_target(name: str) -> tuple[str, str]:
    """``("gymnasium", "FrozenLake-v1")`` from ``"gymnasium:FrozenLake-v1"``.

    Raises:
        ConfigError: ``name`` is not such a target.
    """
    if not is_target(name):
        raise ConfigError(f"{name!r} is not <library>:<id> with a library of {', '.join(LIBRARIES)} "
                          "(e.g. gymnasium:FrozenLake-v1, textarena:TowerOfHanoi-v0)")
    prefix, _, rest = name.partition(":")
    return prefix, rest


def instance_name(name: str) -> str:
    """The server instance a target becomes: ``gymnasium_FrozenLake-v1`` (cookie- and path-safe)."""
    prefix, rest = split_target(name)
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9_.-]+', '.', rest)}"


def target_config(name: str, **settings: Any) -> dict[str, Any]:
    """The NeMo Gym config of a target: one resources server; ``settings`` are more keys of its block."""
    prefix, rest = split_target(name)
    impl, key, app = LIBRARIES[prefix]
    block = {"entrypoint": str(APPS / app), "domain": "games", "verified": False,
             "description": f"{prefix} env {rest}, hosted by nemo_gym_env's bridge", key: rest, **settings}
    return {instance_name(name): {"resources_servers": {impl: block}}}


def is_hosted(config: dict[str, Any]) -> bool:
    """Whether a server block is one of the bridge's apps (a ``gymnasium:`` or ``textarena:`` target)."""
    entry = Path(str(config.get("entrypoint") or ""))
    return entry.is_absolute() and entry.parent == APPS


def check_hosted(instance: str, config: dict[str, Any]) -> None:
    """Build a hosted server from its block here, once, as its process will: every mistake is one line now.

    Raises:
        ConfigError: the id is unknown, the module does not import, the game needs the network, ...
    """
    from pydantic import ValidationError

    if Path(str(config["entrypoint"])).name == LIBRARIES["gymnasium"][2]:
        from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer as server_cls
    else:
        from nemo_gym_env.bridge.textarena_game import TextArenaServer as server_cls
    try:
        server_cls.from_config(config, instance)
    except ConfigError as exc:
        raise ConfigError(f"{instance}: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        raise ConfigError(f"{instance}: {f'config key {where}: ' if where else ''}{message}") from None
    except Exception as exc:  # noqa: BLE001 - the library's own errors, as one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{instance}: {type(exc).__name__}: {first}") from None
