"""``NemoGymVectorBase``: what every vector env of the package shares, as Gymnasium's ``VectorEnv`` serves its siblings.

Three vector envs stand on it: :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv` (one server,
every sub-env on one event loop), :class:`~nemo_gym_env.envs.mixture_vector.NemoGymMixtureVectorEnv`
(several environments by weight) and :class:`~nemo_gym_env.ray_cluster.RayVectorEnv` (sub-envs
spread over Ray workers). Each writes two coroutines, ``_areset(seeds, mask, task_indices)`` and
``_astep(actions)``, plus :attr:`live_mask` and :meth:`sub_env_attr`; the base gives every one of
them the same public surface:

- ``reset`` / ``step`` and their async twins ``areset`` / ``astep``, on the process's background
  loop (one loop per process: a sync caller and an async trainer share it);
- the options every reset takes (``seed`` as an int or a list, ``options["reset_mask"]``,
  ``options["task_indices"]``), checked once, and the action count checked before anything plays;
- ``get_attr(name)``, a per sub-env attribute (``last_verify``, ``task``, ``trajectory``, ...);
- the Gymnasium batching of per sub-env results (:meth:`batch`).

Example (a subclass)::

    class MyVector(NemoGymVectorBase):
        async def _areset(self, seeds, mask, task_indices): ...   # {i: (obs, info)} for i in mask
        async def _astep(self, actions): ...                      # per sub-env (step result, final)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space, Tuple
from gymnasium.vector import AutoresetMode, VectorEnv

from nemo_gym_env.client.loop import background_loop

__all__ = ["NemoGymVectorBase", "StepOut", "SubEnvStep", "env_seeds", "reset_options"]

StepResult = tuple[Any, float, bool, bool, dict[str, Any]]
"""One sub-env's ``(observation, reward, terminated, truncated, info)``."""

SubEnvStep = tuple[StepResult, dict[str, Any] | None]
"""One sub-env's step result and, when it ended and reset in the same step (``SAME_STEP``), its
``{"final_obs": ..., "final_info": ...}``."""

StepOut = tuple[tuple, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
"""Gymnasium's batched step: observations, rewards, terminations, truncations, infos."""


class NemoGymVectorBase(VectorEnv):
    """The vector API every vector env of the package has; see the module docstring."""

    def _setup(self, num_envs: int, autoreset_mode: AutoresetMode | str, render_mode: str | None,
               single_observation_space: Space, single_action_space: Space | None = None,
               action_spaces: Sequence[Space] | None = None) -> None:
        """Set what Gymnasium's ``VectorEnv`` reads: counts, modes, spaces.

        ``action_spaces`` gives each sub-env its own action space (a mixture's); otherwise every
        sub-env has ``single_action_space``.
        """
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        self.render_mode = render_mode
        self.single_observation_space = single_observation_space
        self.observation_space = Tuple([single_observation_space] * num_envs)
        if single_action_space is not None:
            self.single_action_space = single_action_space
        self.action_space = Tuple(list(action_spaces) if action_spaces is not None
                                  else [single_action_space] * num_envs)

    # ---- Gymnasium vector API ----------------------------------------------------------------

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[tuple, dict[str, Any]]:
        """Reset sub-envs: all, or those in ``options["reset_mask"]``.

        ``seed`` is an int (sub-env ``i`` gets ``seed + i``) or a list of per-env seeds;
        ``options["task_indices"]`` picks each sub-env's task. A sub-env whose server cannot
        seed a session gets ``infos["error"]`` and is reset again at its next step.
        """
        return background_loop().run(self.areset(seed=seed, options=options))

    def step(self, actions: Sequence[Any]) -> StepOut:
        """Step every sub-env; ``None`` for sub-envs that are about to autoreset (see :attr:`live_mask`)."""
        return background_loop().run(self.astep(actions))

    async def areset(self, *, seed: int | Sequence[int | None] | None = None,
                     options: dict[str, Any] | None = None) -> tuple[tuple, dict[str, Any]]:
        """Async :meth:`reset`."""
        mask, task_indices = reset_options(options, self.num_envs)
        seeds = env_seeds(seed, self.num_envs)
        started = await background_loop().run_async(self._areset(seeds, mask, task_indices))
        observations: list[Any] = [[] for _ in range(self.num_envs)]
        infos: dict[str, Any] = {}
        for i, (obs, info) in sorted(started.items()):
            observations[i] = obs
            infos = self._add_info(infos, info, i)
        return tuple(observations), infos

    async def astep(self, actions: Sequence[Any]) -> StepOut:
        """Async :meth:`step`."""
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions given for num_envs={self.num_envs}")
        return self.batch(await background_loop().run_async(self._astep(actions)))

    @property
    def live_mask(self) -> np.ndarray:
        """Which sub-envs expect an action at the next :meth:`step` (the rest take ``None``)."""
        raise NotImplementedError

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Per sub-env attribute of its current episode, e.g. ``last_verify``, ``trajectory``, ``task``
        (``None`` where a sub-env has no episode or no such attribute)."""
        return tuple(self.sub_env_attr(name))

    # ---- what a subclass writes ------------------------------------------------------------

    async def _areset(self, seeds: list[int | None], mask: np.ndarray,
                      task_indices: list[int | None] | None) -> dict[int, tuple[Any, dict[str, Any]]]:
        """Start a new episode on every sub-env in ``mask``: ``{i: (obs, info)}``."""
        raise NotImplementedError

    async def _astep(self, actions: list[Any]) -> list[SubEnvStep]:
        """Play one step on every sub-env (actions already counted); checks every action before any plays."""
        raise NotImplementedError

    def sub_env_attr(self, name: str) -> list[Any]:
        """``name`` of every sub-env's episode, in sub-env order."""
        raise NotImplementedError

    # ---- shared pieces -----------------------------------------------------------------------

    def batch(self, results: Sequence[SubEnvStep]) -> StepOut:
        """Per sub-env ``(step result, final obs and info or None)`` -> Gymnasium's batched step."""
        observations = []
        rewards = np.zeros(len(results), dtype=np.float64)
        terminations = np.zeros(len(results), dtype=bool)
        truncations = np.zeros(len(results), dtype=bool)
        infos: dict[str, Any] = {}
        for i, ((obs, reward, terminated, truncated, info), final) in enumerate(results):
            observations.append(obs)
            rewards[i], terminations[i], truncations[i] = reward, terminated, truncated
            if final is not None:
                infos = self._add_info(infos, final, i)
            infos = self._add_info(infos, info, i)
        return tuple(observations), rewards, terminations, truncations, infos


def env_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None]:
    """Per sub-env seeds, the Gymnasium way: an int gives sub-env ``i`` ``seed + i``."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"{len(seeds)} seeds given for num_envs={num_envs}")
    return seeds


def reset_options(options: dict[str, Any] | None, num_envs: int) -> tuple[np.ndarray, list | None]:
    """``(reset_mask, task_indices)`` from a vector reset's options; anything else is an error."""
    options = dict(options or {})
    mask = np.asarray(options.pop("reset_mask", np.ones(num_envs, dtype=bool)), dtype=bool)
    if mask.shape != (num_envs,):
        raise ValueError(f"reset_mask must have shape ({num_envs},), got {mask.shape}")
    task_indices = options.pop("task_indices", None)
    if task_indices is not None:
        task_indices = list(task_indices)
        if len(task_indices) != num_envs:
            raise ValueError(f"task_indices must have {num_envs} entries, got {len(task_indices)}")
    if options:
        raise ValueError(f"unknown reset options {sorted(options)}; use 'task_indices' or 'reset_mask'")
    return mask, task_indices
