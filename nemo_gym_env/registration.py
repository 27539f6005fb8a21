"""Gymnasium ids for every bundled server, registered when ``nemo_gym_env`` is imported.

Gymnasium 1.x has no plugin entry points, so ``import nemo_gym_env`` is what makes
``gym.make("NemoGym/<server>-v0")`` work. Bump ``-vN`` when step or reward semantics change.
"""

from __future__ import annotations

import gymnasium as gym

from .catalog import bundled_servers

__all__ = ["GENERIC_ID", "env_id", "register_envs"]

NAMESPACE = "NemoGym"
GENERIC_ID = f"{NAMESPACE}/Generic-v0"
"""Any server: ``gym.make(GENERIC_ID, base_url=..., dataset=...)`` or ``config_paths=[...]``."""

ENTRY_POINT = "nemo_gym_env.env:NemoGymEnv"
VECTOR_ENTRY_POINT = "nemo_gym_env.vector:NemoGymVectorEnv"

NONDETERMINISTIC = frozenset({"code_gen"})
"""Bundled servers whose verdict depends on more than the seed and the actions: code_gen runs
the program under wall-clock limits (a solution near its time limit passes on an idle machine
and fails on a loaded one) and reports the time its tests took. Their ids carry
``nondeterministic=True``, the flag Gymnasium's checker reads."""


def env_id(server: str) -> str:
    """The Gymnasium id of a bundled server, e.g. ``NemoGym/example_multi_step-v0``."""
    return f"{NAMESPACE}/{server}-v0"


def register_envs() -> list[str]:
    """Register (once) the generic id and one id per bundled server; return the ids."""
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
    return ids
