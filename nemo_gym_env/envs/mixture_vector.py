"""``NemoGymMixtureVectorEnv``: one vector env whose sub-envs play different environments by weight.

Example:
    >>> import gymnasium as gym, nemo_gym_env
    >>> envs = gym.make_vec("NemoGym/Mixture-v0", num_envs=4,
    ...                     envs={"NemoGym/math-v0": 0.5, "NemoGym/mcqa-v0": 0.5})
    >>> obs, infos = envs.reset(seed=0)
    >>> sorted(infos["env_id"].tolist())
    ['NemoGym/math-v0', 'NemoGym/math-v0', 'NemoGym/mcqa-v0', 'NemoGym/mcqa-v0']
    >>> envs.close()

Each environment is a :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv` over its own server
(started, or given by its entry's ``base_url``) holding the sub-envs that play it; a sub-env's
tasks are drawn from its environment's rows. A step checks every sub-env's action before any
plays, then plays them all at once. Every info a sub-env reports carries ``env_id``, its
environment's id (``final_info`` too, in ``SAME_STEP`` mode).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from nemo_gym_env.envs.episode import Episode
from nemo_gym_env.envs.mixture import MixtureEntry, assign, checked_entries, entry_env_kwargs
from nemo_gym_env.envs.spaces import JsonItems, ResponsesAction
from nemo_gym_env.envs.vector import NemoGymVectorEnv
from nemo_gym_env.envs.vector_base import NemoGymVectorBase, SubEnvStep

__all__ = ["NemoGymMixtureVectorEnv"]

_VECTOR_KEYS = frozenset({"max_steps", "request_timeout_s", "verify_timeout_s", "max_in_flight", "protocol"})


class _Part:
    """The sub-envs of one environment: its vector env and their indices in the mixture."""

    def __init__(self, entry: MixtureEntry, env: NemoGymVectorEnv, indices: list[int]):
        self.entry, self.env, self.indices = entry, env, indices


class NemoGymMixtureVectorEnv(NemoGymVectorBase):
    """Sub-envs playing several environments, in proportion to their weights.

    Args:
        num_envs: Sub-envs in all; at least one per environment with a positive weight.
        envs: Env id -> weight, or env id -> ``{"weight": w, "base_url": ..., "dataset": ...,
            ...}`` (a running server for that environment, its task rows, or any other
            :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv` argument for it alone). A
            bundled server's id plays its example data unless the entry gives a ``dataset``,
            at a given ``base_url`` too.
            Environments of weight 0 are left out (no server is started for them).
        assignment_seed: Seeds which sub-env plays which environment (``None``: in blocks, in
            the order of ``envs``). The counts do not depend on it.
        autoreset_mode: As :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv`'s, for all.
        **kwargs: ``max_steps``, ``request_timeout_s``, ``verify_timeout_s``, ``max_in_flight``,
            ``protocol``: for every environment (an entry's own value wins).

    Raises:
        ConfigError: a negative weight, weights summing to 0, an unknown env id, fewer sub-envs
            than environments with a positive weight, or an unknown argument.
    """

    def __init__(self, num_envs: int = 2, *, envs: Mapping[str, Any] | None = None,
                 assignment_seed: int | None = 0, autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 render_mode: str | None = None, **kwargs: Any):
        entries = checked_entries(envs, kwargs, _VECTOR_KEYS)
        self.env_ids: tuple[str, ...] = tuple(assign(entries, num_envs, assignment_seed))
        """The env id each sub-env plays."""
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.parts: list[_Part] = []
        try:
            for entry in entries:
                indices = [i for i, e in enumerate(self.env_ids) if e == entry.env_id]
                env = NemoGymVectorEnv(entry.server, len(indices), autoreset_mode=self.autoreset_mode,
                                       **{**kwargs, **entry_env_kwargs(entry)})
                self.parts.append(_Part(entry, env, indices))
        except BaseException:
            self.close()
            raise
        spaces: list[Any] = [None] * len(self.env_ids)
        for part in self.parts:
            for i in part.indices:
                spaces[i] = part.env.single_action_space
        names = tuple(dict.fromkeys(n for part in self.parts for n in part.env.single_action_space.tool_names))
        # single_action_space holds every environment's tool names; action_space[i] is sub-env i's own.
        self._setup(len(self.env_ids), self.autoreset_mode, render_mode, JsonItems(),
                    ResponsesAction(tool_names=names), action_spaces=spaces)

    # ---- what the base asks for ------------------------------------------------------------

    def close_extras(self, **kwargs: Any) -> None:
        """Close every environment's vector env (and give back the servers they started)."""
        for part in getattr(self, "parts", []):
            part.env.close()

    @property
    def live_mask(self) -> np.ndarray:
        """Which sub-envs expect an action at the next :meth:`step` (the rest take ``None``)."""
        mask = np.zeros(self.num_envs, dtype=bool)
        for part in self.parts:
            mask[part.indices] = part.env.live_mask
        return mask

    @property
    def episodes(self) -> list[Episode | None]:
        """Each sub-env's current episode."""
        out: list[Episode | None] = [None] * self.num_envs
        for part in self.parts:
            for i, episode in zip(part.indices, part.env.episodes):
                out[i] = episode
        return out

    def sub_env_attr(self, name: str) -> list[Any]:
        """``name`` of every sub-env's episode (``last_verify``, ``trajectory``, ``task``, ...)."""
        return [getattr(e, name, None) for e in self.episodes]

    # ---- internals -------------------------------------------------------------------------

    def _named(self, i: int, info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "env_id": self.env_ids[i]}

    async def _areset(self, seeds: list[int | None], mask: np.ndarray,
                      task_indices: list[int | None] | None) -> dict[int, tuple[list, dict]]:
        started = await asyncio.gather(*(
            part.env.reset_some([seeds[i] for i in part.indices], [mask[i] for i in part.indices],
                                None if task_indices is None else [task_indices[i] for i in part.indices])
            for part in self.parts))
        return {part.indices[local]: (obs, self._named(part.indices[local], info))
                for part, results in zip(self.parts, started) for local, (obs, info) in results.items()}

    async def _astep(self, actions: list[Any]) -> list[SubEnvStep]:
        # Every action is checked before any sub-env plays: a bad one changes nothing anywhere.
        turns = [part.env.check_actions([actions[i] for i in part.indices], indices=part.indices)
                 for part in self.parts]
        played = await asyncio.gather(*(part.env.play_turns(t) for part, t in zip(self.parts, turns)))
        results: list[Any] = [None] * self.num_envs
        for part, part_results in zip(self.parts, played):
            for i, (step, final) in zip(part.indices, part_results):
                obs, reward, terminated, truncated, info = step
                if final is not None:
                    final = {**final, "final_info": self._named(i, final["final_info"])}
                results[i] = ((obs, reward, terminated, truncated, self._named(i, info)), final)
        return results
