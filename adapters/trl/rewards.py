"""The reward functions of the ``rollout_func`` route: the environment's own reward, one per reward
component, and shaping terms from the verdict's other numbers.

:func:`env_reward` is the episode's reward (the ``/verify`` reward, or its sum with the step
rewards when the env was made with ``episode_reward="sum"``). :func:`component_rewards` makes
one reward function per ``reward_components`` entry of the ``/verify`` reply, so that TRL
weights them (``GRPOConfig(reward_weights=[...])``) and logs each under its own name.
:func:`metric_rewards` does the same for any numeric field of the reply (``looked_up``,
``num_tool_calls``...): a shaped reward the trainer chooses, leaving the environment's own intact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["component_rewards", "env_reward", "metric_rewards"]

RESERVED_FIELDS = frozenset({
    "prompt", "prompts", "completion", "completions", "completion_ids", "task", "task_index", "trainer_state",
    "log_extra", "log_metric", "environments", "prompt_ids", "logprobs", "env_mask", "env_reward",
    "num_turns", "truncated", "env_error", "reward_components", "step_rewards", "step_reward_sum",
})
"""Names TRL or the rollout's own columns use: a verify metric of one of these names becomes ``verify_<name>``."""

COMPONENT_PREFIX = "component_"
"""The rollout column of component ``<name>`` (:data:`nemo_gym_env.adapters.trl.rollout.COMPONENT_PREFIX`)."""


def env_reward(completions: list[Any], env_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """Each episode's ``/verify`` reward (the rollout's ``env_reward`` column), for ``reward_funcs``.

    None (a failed episode) makes TRL treat the sample as unscorable. When TRL passes
    ``log_metric``, also logs ``env/num_turns``, ``env/truncated`` and ``env/failed`` (batch means).

    Example:
        >>> env_reward(["a", "b"], env_reward=[1.0, None])
        [1.0, None]
    """
    rewards = [None if r is None else float(r) for r in env_reward]
    log_metric = kwargs.get("log_metric")
    if callable(log_metric) and rewards:
        turns = kwargs.get("num_turns") or []
        if turns:
            log_metric("env/num_turns", sum(turns) / len(turns))
        truncated = kwargs.get("truncated") or []
        if truncated:
            log_metric("env/truncated", sum(bool(t) for t in truncated) / len(truncated))
        log_metric("env/failed", sum(r is None for r in rewards) / len(rewards))
    return rewards


def component_rewards(names: Sequence[str]) -> list[Callable[..., list[float | None]]]:
    """One TRL reward function per reward component, in the order of ``names``.

    Each returns its component's value for every rollout (the ``component_<name>`` column the
    rollout adds); None for a rollout whose verdict has no such component (a failed episode),
    which TRL treats as unscorable. The function's ``__name__`` is ``component_<name>``, the
    name TRL logs it under. Weigh them with ``GRPOConfig(reward_weights=[...])``::

        reward_funcs = component_rewards(["punctuation:no_comma", "detectable_format:title"])
        GRPOTrainer(..., reward_funcs=reward_funcs, args=GRPOConfig(reward_weights=[0.5, 1.0], ...))

    Raises:
        ValueError: no names, a name given twice, or a name that is not a non-empty string.
    """
    names = list(names)
    if not names:
        raise ValueError("component_rewards needs at least one component name")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a component name is a non-empty string, got {name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"component names repeat: {names}")
    return [_component_reward(name) for name in names]


def _component_reward(name: str) -> Callable[..., list[float | None]]:
    column = COMPONENT_PREFIX + name

    def reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
        values = kwargs.get(column)
        if values is None:
            if "env_reward" not in kwargs:
                raise ValueError(f"reward function {column!r} needs the columns of nemo_gym_rollout_func's "
                                 "rollouts; use it with rollout_func=nemo_gym_rollout_func(...)")
            # No rollout of this batch has the component (e.g. every episode failed).
            return [None] * len(completions)
        out: list[float | None] = []
        for value in values:
            if value is None:
                out.append(None)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"reward component {name!r} is {value!r}, not a finite number")
            else:
                out.append(float(value))
        return out

    reward.__name__ = reward.__qualname__ = column
    return reward


def metric_rewards(names: Sequence[str]) -> list[Callable[..., list[float | None]]]:
    """One TRL reward function per numeric field of the ``/verify`` reply, in the order of ``names``.

    On the ``rollout_func`` route the rollout passes every numeric field of the verdict to reward
    functions as a column of its name (``verify_<name>`` for a name TRL or the rollout uses
    itself); on the ``environment_factory`` route TRL passes the environments, and the field is
    read from each one's verdict (:func:`~nemo_gym_env.adapters.trl.environment.verdict_of`,
    verifying the episode first if TRL has not yet). Each function returns that field (None for a
    failed episode, or for one whose verdict lacks it; a boolean counts 1 or 0); its ``__name__``
    is ``metric_<name>``. Weigh them against the environment's reward with
    ``GRPOConfig(reward_weights=[1.0, w, ...])``::

        reward_funcs = [env_reward, *metric_rewards(["looked_up"])]     # partial credit per lookup

    Raises:
        ValueError: no names, a name given twice, or a name that is not a non-empty string.
    """
    names = list(names)
    if not names:
        raise ValueError("metric_rewards needs at least one field name")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a field name is a non-empty string, got {name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"field names repeat: {names}")
    return [_metric_reward(name) for name in names]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"verify field {name!r} is {value!r}, not a finite number")
    return float(value)


def _metric_reward(name: str) -> Callable[..., list[float | None]]:
    column = name if name not in RESERVED_FIELDS else f"verify_{name}"

    def reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
        if "env_reward" in kwargs:  # rollout_func: the rollout's columns
            values = kwargs.get(column) or [None] * len(completions)
            return [None if episode is None or value is None else _number(name, value)
                    for value, episode in zip(values, kwargs["env_reward"])]
        environments = kwargs.get("environments")
        if environments:  # environment_factory: each environment's verdict
            from nemo_gym_env.adapters.trl.environment import verdict_of

            out: list[float | None] = []
            for environment in environments:
                verdict = verdict_of(environment)
                value = None if verdict is None else verdict.get(name)
                out.append(None if value is None else _number(name, value))
            return out
        raise ValueError(f"reward function 'metric_{name}' needs the columns of nemo_gym_rollout_func's rollouts "
                         "or the environments of nemo_gym_environment; use it with one of them")

    reward.__name__ = reward.__qualname__ = f"metric_{name}"
    return reward
