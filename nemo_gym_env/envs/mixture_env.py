"""``NemoGymMixtureEnv``: one env that draws, at every reset, which environment it plays, by weight.

Example:
    >>> import gymnasium as gym, nemo_gym_env
    >>> env = gym.make("NemoGym/Mixture-v0", envs={"NemoGym/math-v0": 0.5, "NemoGym/mcqa-v0": 0.5})
    >>> obs, info = env.reset(seed=0)
    >>> info["env_id"] in ("NemoGym/math-v0", "NemoGym/mcqa-v0")
    True
    >>> env.close()

The single-env form of ``NemoGym/Mixture-v0`` (``gym.make_vec`` gives
:class:`~nemo_gym_env.envs.mixture_vector.NemoGymMixtureVectorEnv`, whose sub-envs each play one
environment for good). Every environment is a :class:`~nemo_gym_env.envs.env.NemoGymEnv` over its
own server, made once; a reset draws one of them from the env's ``np_random`` in proportion to the
weights and resets it with a seed drawn from the same generator, so the same seed gives the same
environment and the same task. ``options["env_id"]`` picks the environment instead; the rest of
the options (``task_index``, ``row``) go to it. Every ``info`` carries ``env_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from nemo_gym_env.envs.env import NemoGymEnv
from nemo_gym_env.envs.episode import StepResult
from nemo_gym_env.envs.mixture import checked_entries, entry_env_kwargs
from nemo_gym_env.envs.spaces import JsonItems, ResponsesAction

__all__ = ["NemoGymMixtureEnv"]

ENV_KEYS = frozenset({"max_steps", "request_timeout_s", "verify_timeout_s", "protocol", "episode_reward",
                      "on_server_error"})
"""The :class:`~nemo_gym_env.envs.env.NemoGymEnv` arguments a mixture passes to every environment."""


class NemoGymMixtureEnv(gym.Env[list, Any]):
    """Several environments behind one env: each reset plays one, drawn by weight.

    Args:
        envs: Env id -> weight, or env id -> ``{"weight": w, "base_url": ..., "dataset": ...,
            ...}``, as for the vector form (environments of weight 0 are left out).
        **kwargs: ``max_steps``, ``request_timeout_s``, ``verify_timeout_s``, ``protocol``,
            ``episode_reward``, ``on_server_error``: for every environment (an entry's own
            value wins).

    Raises:
        ConfigError: an unknown env id, a bad weight, weights summing to 0, or an unknown argument.
    """

    metadata = {"render_modes": []}

    def __init__(self, envs: Mapping[str, Any] | None = None, render_mode: str | None = None, **kwargs: Any):
        if render_mode is not None:
            raise ValueError(f"NemoGym/Mixture-v0 renders nothing; render_mode must be None, got {render_mode!r}")
        entries = checked_entries(envs, kwargs, ENV_KEYS)
        self.render_mode = None
        self.env_ids: tuple[str, ...] = tuple(e.env_id for e in entries)
        """The environments, in the order of ``envs``."""
        weights = np.array([e.weight for e in entries], dtype=np.float64)
        self.probabilities = weights / weights.sum()
        """The chance that a reset plays each environment of :attr:`env_ids`."""
        self.envs: list[NemoGymEnv] = []
        try:
            for entry in entries:
                self.envs.append(NemoGymEnv(entry.server, **{**kwargs, **entry_env_kwargs(entry)}))
        except BaseException:
            self.close()
            raise
        names = tuple(dict.fromkeys(n for env in self.envs for n in env.action_space.tool_names))
        self.observation_space = JsonItems()
        self.action_space = ResponsesAction(tool_names=names)
        self.active: int | None = None
        """The index in :attr:`env_ids` of the environment the current episode plays."""

    # ---- Gymnasium API -----------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list, dict]:
        """Draw an environment (or take ``options["env_id"]``) and start an episode on it."""
        env, sub_seed, options = self._draw(seed, options)
        obs, info = env.reset(seed=sub_seed, options=options)
        return obs, self._named(info)

    def step(self, action: Any) -> StepResult:
        """Play one model turn on the current episode's environment."""
        obs, reward, terminated, truncated, info = self._current().step(action)
        return obs, reward, terminated, truncated, self._named(info)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list, dict]:
        """Async :meth:`reset`."""
        env, sub_seed, options = self._draw(seed, options)
        obs, info = await env.areset(seed=sub_seed, options=options)
        return obs, self._named(info)

    async def astep(self, action: Any) -> StepResult:
        """Async :meth:`step`."""
        obs, reward, terminated, truncated, info = await self._current().astep(action)
        return obs, reward, terminated, truncated, self._named(info)

    def close(self) -> None:
        """Close every environment (each gives back its shared server); safe to call twice."""
        for env in getattr(self, "envs", []):
            env.close()

    # ---- results -----------------------------------------------------------------------

    @property
    def env_id(self) -> str | None:
        """The env id the current episode plays (None before the first reset)."""
        return None if self.active is None else self.env_ids[self.active]

    @property
    def task(self) -> dict[str, Any] | None:
        """The current task row."""
        return None if self.active is None else self.envs[self.active].task

    @property
    def last_verify(self) -> dict[str, Any] | None:
        """The full ``/verify`` reply of the current environment's last finished episode."""
        return None if self.active is None else self.envs[self.active].last_verify

    @property
    def response(self) -> Any:
        """The current episode so far as a Responses-API ``Response``."""
        return None if self.active is None else self.envs[self.active].response

    # ---- internals -----------------------------------------------------------------------

    def _draw(self, seed: int | None, options: dict[str, Any] | None) -> tuple[NemoGymEnv, int, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        wanted = options.pop("env_id", None)
        if wanted is None:
            self.active = int(self.np_random.choice(len(self.envs), p=self.probabilities))
        elif wanted in self.env_ids:
            self.active = self.env_ids.index(wanted)
        else:
            raise ValueError(f"options['env_id'] is {wanted!r}, which is none of {list(self.env_ids)}")
        return self.envs[self.active], int(self.np_random.integers(2**31)), options

    def _current(self) -> NemoGymEnv:
        if self.active is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        return self.envs[self.active]

    def _named(self, info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "env_id": self.env_ids[self.active]}
