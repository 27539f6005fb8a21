"""Finding what a user names: a registered Gymnasium id, ``module:Class``, ``module:function``.

Every failure is a :class:`~nemo_gym_env.errors.ConfigError` of one line that says what was
looked for and what to do, raised before a server serves (``nemo-gym-env serve`` calls the same
functions in its own process first, so the person at the terminal reads that line, not a log).

Example:
    >>> make_gym_env("CliffWalking-v1").unwrapped.__class__.__name__
    'CliffWalkingEnv'
    >>> make_gym_env("NoSuchEnv-v0")
    Traceback (most recent call last):
    ...
    nemo_gym_env.errors.ConfigError: no Gymnasium env 'NoSuchEnv-v0': it is not a registered id, nor module:Class
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from nemo_gym_env.errors import ConfigError

__all__ = ["env_class", "load_object", "make_gym_env", "render_modes"]


def load_object(reference: str, what: str = "object") -> Any:
    """``module:attribute`` (or ``module.attribute``) imported and looked up.

    Raises:
        ConfigError: the text names no module, the module does not import, or lacks the attribute.
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep:
        module_name, _, attribute = reference.rpartition(".")
    if not module_name or not attribute:
        raise ConfigError(f"{what} {reference!r} is not module:name (e.g. my_package.envs:MyEnv)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - whatever the import raised is the reason, in one line
        raise ConfigError(f"{what} {reference!r}: module {module_name!r} does not import: "
                          f"{type(exc).__name__}: {_first_line(exc)}") from None
    found = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigError(f"{what} {reference!r}: module {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    return found


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _is_registered(env_id: str) -> bool:
    try:
        gym.spec(env_id)
    except gym.error.Error:
        return False
    return True


def env_class(env_id: str) -> type:
    """The class behind a registered id or a ``module:Class`` (before making an env of it).

    Raises:
        ConfigError: the id is not registered and names no importable ``gymnasium.Env`` class.
    """
    if _is_registered(env_id):
        entry = gym.spec(env_id).entry_point
        found = load_object(entry, f"the entry point of {env_id}") if isinstance(entry, str) else entry
        return found if isinstance(found, type) else type(found)
    if ":" not in env_id:
        stem = env_id.lower().split("-")[0]
        close = sorted(name for name in gym.registry if name.lower().split("-")[0] == stem)
        hint = f" (registered: {', '.join(close[:5])})" if close else ""
        raise ConfigError(f"no Gymnasium env {env_id!r}: it is not a registered id{hint}, nor module:Class")
    cls = load_object(env_id, "env class")
    if not (isinstance(cls, type) and issubclass(cls, gym.Env)):
        raise ConfigError(f"{env_id!r} is {cls!r}, not a gymnasium.Env subclass")
    return cls


def render_modes(cls: type) -> list[str]:
    """The render modes an env class declares."""
    return list((getattr(cls, "metadata", None) or {}).get("render_modes", []) or [])


def make_gym_env(env_id: str, kwargs: Mapping[str, Any] | None = None, *, render_mode: str | None = None,
                 max_episode_steps: int | None = None) -> gym.Env:
    """A new env of ``env_id``: a registered id (``gym.make``) or ``module:Class`` (a ``gymnasium.Env``).

    ``max_episode_steps`` wraps it in Gymnasium's ``TimeLimit`` (a registered id keeps its own
    limit unless this is given).

    Raises:
        ConfigError: the id is not registered and names no importable class, or making it failed.
    """
    kwargs = dict(kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if _is_registered(env_id):
        try:
            return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"gym.make({env_id!r}) failed: {type(exc).__name__}: {_first_line(exc)}") from None
    cls = env_class(env_id)
    try:
        env = cls(**kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"{env_id}({', '.join(kwargs)}) failed: {type(exc).__name__}: {_first_line(exc)}") from None
    return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps else env
