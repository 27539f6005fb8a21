"""The producer as NeMo RL's Ray actor, and NeMo RL told to create ours instead of NeMo Gym's.

:func:`actor_class` is :class:`~nemo_gym_env.adapters.nemo_rl.producer.NemoGymRollouts` as a
``@ray.remote`` actor, built on first use so importing this module never needs ray;
:func:`spinup_actor` stands in for NeMo RL's ``spinup_nemo_gym_actor``;
:func:`register_with_nemo_rl` installs it in NeMo RL's GRPO and distillation set-up.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nemo_gym_env.adapters.nemo_rl.policy import PolicySource
from nemo_gym_env.adapters.nemo_rl.producer import NemoGymRollouts
from nemo_gym_env.ray_cluster.connection import import_ray

__all__ = ["actor_class", "register_with_nemo_rl", "spinup_actor"]

_ACTOR_CLASS: Any = None

_NEMO_RL_HOMES = ("nemo_rl.environments.nemo_gym", "nemo_rl.algorithms.grpo", "nemo_rl.algorithms.distillation",
                  "nemo_rl.algorithms.single_controller_utils.setup")
"""The NeMo RL modules that import ``spinup_nemo_gym_actor`` or the ``NemoGym`` actor class."""


def actor_class() -> Any:
    """:class:`~nemo_gym_env.adapters.nemo_rl.producer.NemoGymRollouts` as a Ray actor class (built on
    first call; needs ``ray``).

    Restarted by Ray if its process dies (``max_restarts=-1``); a call in flight then fails
    rather than being replayed, so a streamed batch is never duplicated.
    """
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        ray = import_ray()
        _ACTOR_CLASS = ray.remote(max_restarts=-1, max_task_retries=0)(NemoGymRollouts)
    return _ACTOR_CLASS


def __getattr__(name: str) -> Any:
    if name == "NemoGymActor":  # the actor class under a constant's name, built when first asked for
        return actor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spinup_actor(env_configs: Mapping[str, Any], base_urls: Sequence[str], model_name: str, *,
                 tokenizer: Any = None, policy: PolicySource | None = None, **_: Any) -> Any:
    """Create, spin up and return our actor: a stand-in for NeMo RL's ``spinup_nemo_gym_actor``.

    Args:
        env_configs: NeMo RL's ``master_config.env``; ``env_configs["nemo_gym"]`` is our block.
        base_urls: The generation servers' OpenAI-compatible URLs (one per data-parallel rank).
        model_name: The served model name.
        tokenizer: Handed to ``set_tokenizer``.
        policy: Overrides the policy (picklable: it travels to the actor).
        **_: NeMo RL's other arguments (router replay, fastokens), not used here.
    """
    ray = import_ray()
    block = dict(env_configs.get("nemo_gym") or {})
    cfg = {
        "model_name": model_name,
        "base_urls": list(base_urls),
        "invalid_tool_call_patterns": block.pop("invalid_tool_call_patterns", None),
        "thinking_tags": block.pop("thinking_tags", None),
        "initial_global_config_dict": block,
    }
    actor = actor_class().options(num_cpus=0).remote(cfg, policy=policy)
    ray.get(actor._spinup.remote())
    if tokenizer is not None:
        ray.get(actor.set_tokenizer.remote(tokenizer))
    return actor


def register_with_nemo_rl(policy: PolicySource | None = None) -> Callable[..., Any]:
    """Make NeMo RL create our actor wherever it would create NeMo Gym's; call before ``setup()``.

    Replaces ``spinup_nemo_gym_actor`` (and the ``NemoGym`` class name the distillation set-up
    uses) in the NeMo RL modules that import them, and runs the actor in this Python (NeMo Gym's
    actor gets a venv of its own). Idempotent.

    Args:
        policy: Overrides the default policy (see :class:`~nemo_gym_env.adapters.nemo_rl.producer.NemoGymRollouts`).

    Returns:
        The installed spin-up function.

    Raises:
        ImportError: ``nemo_rl`` is not importable; the message says how to get it.
    """
    try:
        importlib.import_module("nemo_rl.environments.nemo_gym")
    except ImportError as exc:
        raise ImportError(
            f"register_with_nemo_rl needs NeMo RL ({exc}). The nemo-rl package on PyPI is an empty placeholder: "
            "install NeMo RL from source (git clone https://github.com/NVIDIA-NeMo/RL && cd RL && uv sync "
            "--extra vllm), then `uv pip install 'nemo-gym-env[ray]'` into that environment and run "
            "recipes/nemo_rl/run_grpo.py there. Without NeMo RL, use NemoGymRollouts or actor_class() directly."
        ) from exc

    def spinup(env_configs: Mapping[str, Any], base_urls: Sequence[str], model_name: str, **kwargs: Any) -> Any:
        return spinup_actor(env_configs, base_urls, model_name, policy=policy, **kwargs)

    spinup._nemo_gym_env = True  # type: ignore[attr-defined]
    actor = actor_class()
    for home in _NEMO_RL_HOMES:
        try:
            module = importlib.import_module(home)
        except ImportError:  # an older or newer NeMo RL without this module
            continue
        if hasattr(module, "spinup_nemo_gym_actor"):
            module.spinup_nemo_gym_actor = spinup
        if hasattr(module, "NemoGym"):
            module.NemoGym = actor
    try:
        registry = importlib.import_module("nemo_rl.distributed.ray_actor_environment_registry")
        registry.ACTOR_ENVIRONMENT_REGISTRY["nemo_rl.environments.nemo_gym.NemoGym"] = sys.executable
    except (ImportError, AttributeError):
        pass
    return spinup
