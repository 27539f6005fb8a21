"""Registration with NeMo RL (``nemo_gym_env.adapters.nemo_rl.actor``), against stand-in NeMo RL modules."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from nemo_gym_env.adapters.nemo_rl import register_with_nemo_rl

# ---- registration ----------------------------------------------------------------------------


def test_register_without_nemo_rl_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nemo_rl", None)
    with pytest.raises(ImportError, match=r"empty placeholder.*install NeMo RL from source.*NemoGymRollouts"):
        register_with_nemo_rl()


def test_register_replaces_nemo_gyms_actor_in_nemo_rl(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")

    def original(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("NeMo Gym's actor must not be created")

    fake: dict[str, types.ModuleType] = {}
    for name in ("nemo_rl", "nemo_rl.environments", "nemo_rl.environments.nemo_gym", "nemo_rl.algorithms",
                 "nemo_rl.algorithms.grpo", "nemo_rl.algorithms.distillation", "nemo_rl.distributed",
                 "nemo_rl.distributed.ray_actor_environment_registry"):
        fake[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, fake[name])
    for name in ("nemo_rl.environments.nemo_gym", "nemo_rl.algorithms.grpo"):
        fake[name].spinup_nemo_gym_actor = original
    fake["nemo_rl.environments.nemo_gym"].NemoGym = object
    fake["nemo_rl.algorithms.distillation"].NemoGym = object
    fake["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY = {
        "nemo_rl.environments.nemo_gym.NemoGym": "uv run --extra nemo_gym"}
    register_with_nemo_rl()
    spinup = register_with_nemo_rl()  # idempotent: a second call just installs again
    from nemo_gym_env.adapters.nemo_rl import actor_class

    assert fake["nemo_rl.environments.nemo_gym"].spinup_nemo_gym_actor is spinup

    assert fake["nemo_rl.algorithms.grpo"].spinup_nemo_gym_actor._nemo_gym_env
    assert fake["nemo_rl.environments.nemo_gym"].spinup_nemo_gym_actor._nemo_gym_env
    assert fake["nemo_rl.algorithms.distillation"].NemoGym is actor_class()
    registry = fake["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY
    assert registry["nemo_rl.environments.nemo_gym.NemoGym"] == sys.executable
