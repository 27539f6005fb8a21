"""``NemoGymVectorEnv``: thousands of episodes on one event loop and one connection pool.

Example:
    >>> import gymnasium as gym, nemo_gym_env
    >>> envs = gym.make_vec("NemoGym/example_single_tool_call-v0", num_envs=4)
    >>> obs, infos = envs.reset(seed=0)
    >>> call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>'
    >>> obs, rewards, terminations, truncations, infos = envs.step([call] * 4)
    >>> obs, rewards, terminations, truncations, infos = envs.step(["Cold."] * 4)
    >>> rewards.tolist(), terminations.tolist()
    ([1.0, 1.0, 1.0, 1.0], [True, True, True, True])
    >>> envs.close()

Every sub-env is an :class:`~nemo_gym_env.envs.episode.Episode` on the process's background
loop; a step runs all sub-envs' HTTP concurrently, bounded by ``max_in_flight``. Sub-envs
that are about to autoreset, or have ended with autoreset disabled, take ``None`` as their
action, so a policy only generates for live episodes. A sub-env whose server call fails or
times out ends truncated with ``infos["error"]``; the others go on.

``base_url`` may be a list of identical servers: sub-env ``i`` plays on
``base_url[i % len(base_url)]`` for good, so servers that keep session state in their process
(one uvicorn worker each) can be sharded without a sticky load balancer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.spaces import Tuple
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.episode import EPISODE_REWARDS, Episode, StepResult
from nemo_gym_env.envs.protocols import open_episode, server_traits
from nemo_gym_env.envs.sources import ServerHandle, resolve_server
from nemo_gym_env.envs.spaces import JsonItems, action_space_for
from nemo_gym_env.envs.tasks import pick_task, task_rows
from nemo_gym_env.errors import ActionError, ServerError

__all__ = ["NemoGymVectorEnv", "batch_step", "env_seeds", "reset_options"]

Turn = list[dict[str, Any]] | None
"""A sub-env's checked action for one step: its normalised items, or None for an ended sub-env."""


class NemoGymVectorEnv(VectorEnv):
    """A native vector env over one resources server; arguments as :class:`~nemo_gym_env.envs.env.NemoGymEnv`.

    Args:
        num_envs: Number of concurrent episodes.
        base_url: A running server's URL, or a list of URLs of identical servers (shards):
            sub-env ``i`` then plays every one of its episodes on ``base_url[i % len(base_url)]``,
            so a server that keeps session state in its process always sees the whole episode.
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default), ``SAME_STEP`` (``final_obs`` and
            ``final_info`` in infos) or ``DISABLED`` (reset with ``options={"reset_mask": mask}``).
        max_in_flight: Bound on concurrent HTTP requests to each server.
        protocol: As :class:`~nemo_gym_env.envs.env.NemoGymEnv`'s.
        episode_reward: As :class:`~nemo_gym_env.envs.env.NemoGymEnv`'s.
        server_handle: A server already resolved (``gym.make_vec`` passes the one it started);
            released on :meth:`close`.

    The shard API (:meth:`check_actions`, :meth:`play_turns`, :meth:`reset_some`) splits a step
    into "check every action" and "play them", so a driver of several vector envs
    (:class:`~nemo_gym_env.ray_cluster.RayVectorEnv`) can refuse a bad action anywhere before
    any sub-env anywhere plays.
    """

    def __init__(
        self,
        server: str | None = None,
        num_envs: int = 1,
        *,
        base_url: str | Sequence[str] | None = None,
        dataset: str | Path | Sequence[dict[str, Any]] | None = None,
        config_paths: Sequence[str] | None = None,
        max_steps: int = 16,
        request_timeout_s: float = 60.0,
        verify_timeout_s: float = 300.0,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_in_flight: int = 1024,
        render_mode: str | None = None,
        protocol: str = "auto",
        episode_reward: str = "verify",
        server_handle: ServerHandle | None = None,
    ):
        if episode_reward not in EPISODE_REWARDS:
            raise ValueError(f"episode_reward must be one of {EPISODE_REWARDS}, got {episode_reward!r}")
        self.episode_reward = episode_reward
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_steps < 1 or max_in_flight < 1:
            raise ValueError("max_steps and max_in_flight must be >= 1")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        self.render_mode = render_mode
        self.num_envs = num_envs
        self.max_steps = max_steps
        shards = None
        if base_url is not None and not isinstance(base_url, str):
            shards = [str(url).rstrip("/") for url in base_url]
        if shards is not None and not shards:
            raise ValueError("base_url is an empty list; give at least one server URL")
        self._handle: ServerHandle | None = server_handle or resolve_server(
            server, shards[0] if shards else base_url, config_paths)
        urls = shards or [self._handle.url]
        try:
            self.rows = task_rows(self._handle, dataset)
        except Exception:
            self.close()
            raise
        self.clients = [ResourcesClient(url, timeout_s=request_timeout_s, verify_timeout_s=verify_timeout_s,
                                        max_in_flight=max_in_flight) for url in urls]
        """One client per server; sub-env ``i`` uses ``clients[i % len(clients)]``."""
        self.client = self.clients[0]
        self.protocol = protocol
        self.single_observation_space = JsonItems()
        self.single_action_space = action_space_for(self.rows)
        self.observation_space = Tuple([self.single_observation_space] * num_envs)
        self.action_space = Tuple([self.single_action_space] * num_envs)
        self.episodes: list[Episode | None] = [None] * num_envs
        self._rngs = [seeding.np_random()[0] for _ in range(num_envs)]
        self._needs_reset = np.ones(num_envs, dtype=bool)

    # ---- Gymnasium vector API ----------------------------------------------------------------

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[tuple, dict[str, Any]]:
        """Reset sub-envs: all, or those in ``options["reset_mask"]``.

        ``seed`` is an int (sub-env ``i`` gets ``seed + i``) or a list of per-env seeds;
        ``options["task_indices"]`` picks each sub-env's task. A sub-env whose server cannot
        seed a session gets ``infos["error"]`` and is reset again at its next step.
        """
        return background_loop().run(self._areset(seed, options))

    def step(self, actions: Sequence[Any]) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env; ``None`` for sub-envs that are about to autoreset."""
        return background_loop().run(self._astep(actions))

    async def areset(self, *, seed: int | Sequence[int | None] | None = None,
                     options: dict[str, Any] | None = None) -> tuple[tuple, dict[str, Any]]:
        """Async :meth:`reset`."""
        return await background_loop().run_async(self._areset(seed, options))

    async def astep(self, actions: Sequence[Any]) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Async :meth:`step`."""
        return await background_loop().run_async(self._astep(actions))

    def close_extras(self, **kwargs: Any) -> None:
        """Give back the shared embedded server."""
        if self._handle is not None:
            self._handle.release()

    @property
    def live_mask(self) -> np.ndarray:
        """Which sub-envs expect an action at the next :meth:`step` (the rest take ``None``)."""
        return ~self._needs_reset

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Per sub-env attribute of its episode, e.g. ``last_verify``, ``trajectory``, ``task``."""
        return tuple(getattr(e, name, None) for e in self.episodes)

    # ---- internals -------------------------------------------------------------------------

    async def _start(self, i: int, task_index: int | None = None) -> tuple[list, dict]:
        options = None if task_index is None else {"task_index": task_index}
        index, row = pick_task(self.rows, self._rngs[i], options)
        client = self.clients[i % len(self.clients)]
        try:
            episode = open_episode(await server_traits(client, self.protocol), client, row, index, self.max_steps,
                                   episode_reward=self.episode_reward)
            self.episodes[i] = episode
            obs, info = await episode.start()
        except ServerError as exc:
            self._needs_reset[i] = True
            return [], {"task_index": -1 if index is None else index, "error": str(exc)[:1000]}
        self._needs_reset[i] = False
        return obs, info

    async def _areset(self, seed: Any, options: dict[str, Any] | None) -> tuple[tuple, dict[str, Any]]:
        mask, task_indices = reset_options(options, self.num_envs)
        started = await self.reset_some(env_seeds(seed, self.num_envs), mask, task_indices)
        observations: list[list] = [[] for _ in range(self.num_envs)]
        infos: dict[str, Any] = {}
        for i, (obs, info) in started.items():
            observations[i] = obs
            infos = self._add_info(infos, info, i)
        return tuple(observations), infos

    async def _one_step(self, i: int, items: list[dict[str, Any]] | None) -> tuple[StepResult, dict | None]:
        if items is None:  # an ended sub-env
            if self.autoreset_mode == AutoresetMode.DISABLED:
                return ([], 0.0, False, False, {}), None
            obs, info = await self._start(i)
            return (obs, 0.0, False, False, info), None
        result = await self.episodes[i].play(items)
        obs, reward, terminated, truncated, info = result
        if (terminated or truncated) and self.autoreset_mode == AutoresetMode.SAME_STEP:
            final = {"final_obs": obs, "final_info": info}
            new_obs, new_info = await self._start(i)
            return (new_obs, reward, terminated, truncated, new_info), final
        self._needs_reset[i] = terminated or truncated
        return result, None

    async def _astep(self, actions: Sequence[Any]) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        return batch_step(self, await self.play_turns(self.check_actions(actions)))

    # ---- the shard API -----------------------------------------------------------------------

    def check_actions(self, actions: Sequence[Any], first_index: int = 0,
                      indices: Sequence[int] | None = None) -> list[Turn]:
        """Check and normalise every sub-env's action; nothing is sent, nothing changes.

        ``first_index`` (a shard of a larger env) or ``indices`` (each sub-env's number in a
        mixture) only number the sub-envs in error messages.

        Raises:
            ActionError: an action the env cannot read.
            ValueError: the wrong number of actions, or None for a live sub-env (or an action
                for an ended one with autoreset disabled).
        """
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions given for num_envs={self.num_envs}")
        names = list(indices) if indices is not None else [first_index + i for i in range(self.num_envs)]
        turns: list[Turn] = []
        for i, action in enumerate(actions):
            if self._needs_reset[i]:
                if action is not None and self.autoreset_mode == AutoresetMode.DISABLED:
                    raise ValueError(f"sub-env {names[i]} has ended: reset it with "
                                     "options={'reset_mask': ...} or pass None as its action")
                turns.append(None)
            elif action is None:
                raise ValueError(f"sub-env {names[i]} is live and needs an action; "
                                 "None is only for ended sub-envs")
            else:
                try:
                    turns.append(normalize_action(action, turn=self.episodes[i].turn))
                except ActionError as exc:
                    raise ActionError(f"sub-env {names[i]}: {exc}") from None
        return turns

    async def reset_some(self, seeds: Sequence[int | None], mask: Sequence[bool],
                         task_indices: Sequence[int | None] | None) -> dict[int, tuple[list, dict]]:
        """Start a new episode on every sub-env in ``mask``; ``{i: (obs, info)}``.

        ``seeds[i]`` (when not None) reseeds sub-env ``i``'s task draw; ``task_indices[i]``
        (when given and not None) picks its task.
        """
        chosen = [i for i in range(self.num_envs) if mask[i]]
        for i in chosen:
            if seeds[i] is not None:
                self._rngs[i] = seeding.np_random(seeds[i])[0]
        results = await asyncio.gather(*(self._start(i, None if task_indices is None else task_indices[i])
                                         for i in chosen))
        return dict(zip(chosen, results))

    async def play_turns(self, turns: list[Turn]) -> list[tuple[StepResult, dict | None]]:
        """Play checked turns (:meth:`check_actions`) on every sub-env at once.

        Returns, per sub-env, its step result and, when it ended and autoreset in the same step
        (``SAME_STEP``), its final observation and info; :func:`batch_step` batches them.
        """
        return await asyncio.gather(*(self._one_step(i, t) for i, t in enumerate(turns)))


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


def batch_step(env: VectorEnv, results: Sequence[tuple[StepResult, dict | None]],
               ) -> tuple[tuple, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
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
            infos = env._add_info(infos, final, i)
        infos = env._add_info(infos, info, i)
    return tuple(observations), rewards, terminations, truncations, infos
