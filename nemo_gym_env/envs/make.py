"""The entry points behind ``gym.make`` and ``gym.make_vec``: start the server, then import the env.

An embedded server takes a moment to boot (its process imports fastapi and the server's
modules), and the env's own modules take a while to import too (the wire types' pydantic
models, httpx). Run one after the other, ``gym.make`` would wait for both; here the
server process is spawned first and the env's modules are imported while it boots
(``benchmarks/startup.py`` measures it). Nothing else happens in this module, which imports
only what finding and spawning the server needs.
"""

from __future__ import annotations

import importlib
from typing import Any

from nemo_gym_env.envs.sources import resolve_server

__all__ = ["make_env", "make_mixture", "make_mixture_vector_env", "make_vector_env"]


def make_env(server: str | None = None, *, base_url: str | None = None, config_paths: Any = None,
             library: str | None = None, env_id: str | None = None, game: str | None = None,
             server_config: dict[str, Any] | None = None, num_tasks: int = 1000, **kwargs: Any) -> Any:
    """``gym.make``'s entry point: a :class:`~nemo_gym_env.envs.env.NemoGymEnv`.

    ``NemoGym/Gymnasium-v0`` (``env_id=``) and ``NemoGym/TextArena-v0`` (``game=``) host another
    library's env (``library`` is set by their registration); ``server_config`` holds more keys of
    its server's config, ``num_tasks`` how many seeds its tasks are.
    """
    server = _hosted_target(server, library, env_id, game)
    handle = resolve_server(server, base_url, config_paths, while_starting=_import_env, hosted=server_config,
                            num_tasks=num_tasks)
    try:
        env_module = _import_env()
        return env_module.NemoGymEnv(server, base_url=base_url, config_paths=config_paths, server_handle=handle,
                                     **kwargs)
    except BaseException:
        handle.release()
        raise


def make_vector_env(server: str | None = None, num_envs: int = 1, *, base_url: Any = None,
                    config_paths: Any = None, library: str | None = None, env_id: str | None = None,
                    game: str | None = None, server_config: dict[str, Any] | None = None, num_tasks: int = 1000,
                    **kwargs: Any) -> Any:
    """``gym.make_vec``'s entry point: a :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv` (hosted envs as in :func:`make_env`)."""
    server = _hosted_target(server, library, env_id, game)
    first_url = base_url if base_url is None or isinstance(base_url, str) else (list(base_url) or [None])[0]
    handle = resolve_server(server, first_url, config_paths, while_starting=_import_vector, hosted=server_config,
                            num_tasks=num_tasks)
    try:
        vector_module = _import_vector()
        return vector_module.NemoGymVectorEnv(server, num_envs, base_url=base_url, config_paths=config_paths,
                                              server_handle=handle, **kwargs)
    except BaseException:
        handle.release()
        raise


def make_mixture_vector_env(num_envs: int = 2, **kwargs: Any) -> Any:
    """``gym.make_vec("NemoGym/Mixture-v0", ...)``'s entry point: a
    :class:`~nemo_gym_env.envs.mixture_vector.NemoGymMixtureVectorEnv`."""
    return importlib.import_module("nemo_gym_env.envs.mixture_vector").NemoGymMixtureVectorEnv(num_envs, **kwargs)


def make_mixture(**kwargs: Any) -> Any:
    """``gym.make("NemoGym/Mixture-v0", envs=...)``'s entry point: a
    :class:`~nemo_gym_env.envs.mixture_env.NemoGymMixtureEnv`, which draws its environment at each reset."""
    return importlib.import_module("nemo_gym_env.envs.mixture_env").NemoGymMixtureEnv(**kwargs)


def _hosted_target(server: str | None, library: str | None, env_id: str | None, game: str | None) -> str | None:
    if library is None:
        return server
    name = env_id if library == "gymnasium" else game
    if not name:
        from nemo_gym_env.errors import ConfigError

        key = "env_id" if library == "gymnasium" else "game"
        raise ConfigError(f"NemoGym/{'Gymnasium' if library == 'gymnasium' else 'TextArena'}-v0 needs {key}=..., "
                          f"e.g. gym.make('NemoGym/Gymnasium-v0', env_id='FrozenLake-v1')")
    return f"{library}:{name}"


def _import_env() -> Any:
    return importlib.import_module("nemo_gym_env.envs.env")


def _import_vector() -> Any:
    return importlib.import_module("nemo_gym_env.envs.vector")
