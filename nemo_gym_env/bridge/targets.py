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
from nemo_gym_env.launch.entrypoint import BRIDGE_APPS

__all__ = ["APPS", "HOSTED_APPS", "LIBRARIES", "check_hosted", "instance_name", "is_hosted", "is_target", "split_target", "target_config"]

APPS = Path(__file__).resolve().parent / "apps"
HOSTED_APPS = BRIDGE_APPS
"""Implementation name -> the bridge's app: a config block of one of these needs no app of its own."""

LIBRARIES: dict[str, tuple[str, str, str]] = {
    "gymnasium": ("gymnasium_env", "env_id", BRIDGE_APPS["gymnasium_env"]),
    "textarena": ("textarena_game", "game", BRIDGE_APPS["textarena_game"]),
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


def is_hosted(spec: Any) -> bool:
    """Whether a server spec is served by one of the bridge's apps: a ``gymnasium:`` / ``textarena:`` target,
    or a config block of implementation ``gymnasium_env`` / ``textarena_game`` with no app of its own."""
    from nemo_gym_env.launch.entrypoint import resolve_entrypoint

    try:
        return resolve_entrypoint(spec).parent == APPS
    except Exception:  # noqa: BLE001 - no entrypoint at all: not the bridge's either
        return False


def check_hosted(instance: str, config: dict[str, Any]) -> Any:
    """Build a hosted server from its block here, once, as its process will: every mistake is one line now.

    Returns the server object (its ``action_format``, for a Gymnasium env, states the answer format).

    Raises:
        ConfigError: the id is unknown, the module does not import, the game needs the network, ...
    """
    from pydantic import ValidationError

    _carry_import_roots(config)
    if "env_id" in config:
        from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer as server_cls
    else:
        from nemo_gym_env.bridge.textarena_game import TextArenaServer as server_cls
    try:
        return server_cls.from_config(config, instance)
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


def _carry_import_roots(config: dict[str, Any]) -> None:
    """Record in ``config["python_path"]`` where this process finds the modules the block names.

    The server runs in its own process and folder: a user's ``my_envs:Counter`` that this process
    imports from a script's folder would not import there. Modules under site-packages need nothing.
    """
    import importlib.util
    import sys

    roots = list(config.get("python_path") or [])
    for key in ("env_id", "formatter", "action_parser", "opponent"):
        value = config.get(key)
        if not isinstance(value, str) or ":" not in value:
            continue
        top = value.partition(":")[0].split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not origin or "site-packages" in origin or "dist-packages" in origin or top in sys.stdlib_module_names:
            continue
        path = Path(origin).parent
        root = path.parent if path.name == top else path  # a package's folder, or a module's
        if str(root) not in roots:
            roots.append(str(root))
    if roots:
        config["python_path"] = roots
