"""Gymnasium ids for every bundled server, registered when ``nemo_gym_env`` is imported.

Gymnasium 1.x has no plugin entry points, so ``import nemo_gym_env`` is what makes
``gym.make("NemoGym/<server>-v0")`` work. Bump ``-vN`` when step or reward semantics change.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

__all__ = ["GENERIC_ID", "HOSTED_IDS", "MIXTURE_ID", "env_id", "env_name", "register_envs",
           "register_envs_on_gymnasium_import", "server_name"]

NAMESPACE = "NemoGym"
GENERIC_ID = f"{NAMESPACE}/Generic-v0"
"""Any server: ``gym.make(GENERIC_ID, base_url=..., dataset=...)`` or ``config_paths=[...]``."""

MIXTURE_ID = f"{NAMESPACE}/Mixture-v0"
"""Several envs by weight: ``gym.make_vec(MIXTURE_ID, num_envs=..., envs={id: weight})``, or one env
that draws its environment at each reset, ``gym.make(MIXTURE_ID, envs={id: weight})``
(:mod:`nemo_gym_env.envs.mixture`)."""

HOSTED_IDS = {f"{NAMESPACE}/Gymnasium-v0": "gymnasium", f"{NAMESPACE}/TextArena-v0": "textarena"}
"""Another library's env served for you: ``gym.make("NemoGym/Gymnasium-v0", env_id="FrozenLake-v1")``,
``gym.make("NemoGym/TextArena-v0", game="TowerOfHanoi-v0")`` (:mod:`nemo_gym_env.bridge`)."""

ENTRY_POINT = "nemo_gym_env.envs.make:make_env"
VECTOR_ENTRY_POINT = "nemo_gym_env.envs.make:make_vector_env"

NONDETERMINISTIC = frozenset({"code_gen"})
"""Bundled servers whose verdict depends on more than the seed and the actions: code_gen runs
the program under wall-clock limits (a solution near its time limit passes on an idle machine
and fails on a loaded one) and reports the time its tests took. Their ids carry
``nondeterministic=True``, the flag Gymnasium's checker reads."""


def env_id(server: str) -> str:
    """The Gymnasium id of a bundled server, e.g. ``NemoGym/example_multi_step-v0``."""
    return f"{NAMESPACE}/{server}-v0"


def env_name(this_id: str) -> str:
    """The name inside a Gymnasium id ``[namespace/]name-vN``: ``NemoGym/math-v0`` -> ``math``,
    ``NemoGym/Generic-v0`` -> ``Generic`` (an id without a version is its own name)."""
    rest = str(this_id).rpartition("/")[2]
    name, dash, version = rest.rpartition("-v")
    return name if dash and name and version.isdigit() else rest


def server_name(this_id: str) -> str | None:
    """The bundled server behind an id (``NemoGym/math-v0`` -> ``math``); None for the ids that name no
    bundled server (:data:`GENERIC_ID`, :data:`MIXTURE_ID`, :data:`HOSTED_IDS`). Inverse of :func:`env_id`.

    Raises:
        UnknownServerError: an id of no bundled server (the message lists them).
    """
    from nemo_gym_env.errors import UnknownServerError
    from nemo_gym_env.launch.catalog import bundled_servers

    if this_id in (GENERIC_ID, MIXTURE_ID, *HOSTED_IDS):
        return None
    name = env_name(this_id)
    servers = bundled_servers()
    if env_id(name) != this_id or name not in servers:
        raise UnknownServerError(f"unknown env id {this_id!r}; use a bundled server's id "
                                 f"({', '.join(env_id(s) for s in sorted(servers))}) or {GENERIC_ID} with base_url "
                                 "and dataset")
    return name


def register_envs() -> list[str]:
    """Register (once) the generic id, one id per bundled server and the mixture id; return the ids."""
    # Imported here, not at the top: a launched server process imports this module (through
    # ``import nemo_gym_env``) on its boot path and never needs Gymnasium or the config stack.
    import gymnasium as gym

    from nemo_gym_env.launch.catalog import bundled_servers

    ids = []
    for name in [None, *sorted(bundled_servers())]:
        this_id = GENERIC_ID if name is None else env_id(name)
        ids.append(this_id)
        if this_id in gym.registry:
            continue
        gym.register(
            id=this_id,
            entry_point=ENTRY_POINT,
            vector_entry_point=VECTOR_ENTRY_POINT,
            kwargs={} if name is None else {"server": name},
            nondeterministic=name in NONDETERMINISTIC,
        )
    for this_id, library in HOSTED_IDS.items():
        ids.append(this_id)
        if this_id not in gym.registry:
            gym.register(id=this_id, entry_point=ENTRY_POINT, vector_entry_point=VECTOR_ENTRY_POINT,
                         kwargs={"library": library})
    ids.append(MIXTURE_ID)
    if MIXTURE_ID not in gym.registry:
        gym.register(id=MIXTURE_ID, entry_point="nemo_gym_env.envs.make:make_mixture",
                     vector_entry_point="nemo_gym_env.envs.make:make_mixture_vector_env")
    return ids


def register_envs_on_gymnasium_import() -> None:
    """Register the ids as soon as ``gymnasium`` is imported; at once if it already is.

    What ``import nemo_gym_env`` does. A resources server, a verifier worker and most commands import
    the package but have no use for Gymnasium, which costs ~0.2 s of CPU (numpy included) a process;
    code that does use it imports ``gymnasium`` (before or after this package), and the ids are
    registered right after that import, as if nothing were deferred.
    """
    if "gymnasium" in sys.modules:
        register_envs()
    elif not any(isinstance(f, _RegisterAfterGymnasium) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterGymnasium())


class _RegisterAfterGymnasium(importlib.abc.MetaPathFinder):
    """Import hook: lets ``gymnasium`` be found as usual, and calls :func:`register_envs` once it has run.

    It stays in place until gymnasium is imported: a mere ``importlib.util.find_spec("gymnasium")`` (a
    check whether it is installed) passes through it without using it up.
    """

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "gymnasium" or self._finding:
            return None
        self._finding = True  # the find_spec below must not come back here
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module: Any) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            register_envs()

        spec.loader.exec_module = exec_and_register  # type: ignore[method-assign]
        return spec
