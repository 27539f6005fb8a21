"""The reward function of the ``rollout_func`` route: the environment's own ``/verify`` reward."""

from __future__ import annotations

from typing import Any

__all__ = ["env_reward"]


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
