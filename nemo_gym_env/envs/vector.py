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
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode

from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.episode import EPISODE_REWARDS, Episode
from nemo_gym_env.envs.sources import ServerHandle, resolve_server
from nemo_gym_env.envs.spaces import JsonItems, action_space_for
from nemo_gym_env.envs.tasks import pick_task, task_rows
from nemo_gym_env.envs.traits import start_episode
from nemo_gym_env.envs.vector_base import NemoGymVectorBase, SubEnvStep
from nemo_gym_env.errors import ActionError, ServerError
from nemo_gym_env.protocol.defaults import MAX_STEPS, REQUEST_TIMEOUT_S, VERIFY_TIMEOUT_S

__all__ = ["NemoGymVectorEnv"]

Turn = list[dict[str, Any]] | None
"""A sub-env's checked action for one step: its normalised items, or None for an ended sub-env."""


class NemoGymVectorEnv(NemoGymVectorBase):
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
        max_steps: int = MAX_STEPS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        verify_timeout_s: float = VERIFY_TIMEOUT_S,
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
        self._setup(num_envs, autoreset_mode, render_mode, JsonItems(), action_space_for(self.rows))
        self.episodes: list[Episode | None] = [None] * num_envs
        self._rngs = [seeding.np_random()[0] for _ in range(num_envs)]
        self._needs_reset = np.ones(num_envs, dtype=bool)

    # ---- what the base asks for ------------------------------------------------------------

    def close_extras(self, **kwargs: Any) -> None:
        """Give back the shared embedded server."""
        if self._handle is not None:
            self._handle.release()

    @property
    def live_mask(self) -> np.ndarray:
        """Which sub-envs expect an action at the next :meth:`step` (the rest take ``None``)."""
        return ~self._needs_reset

    def sub_env_attr(self, name: str) -> list[Any]:
        """``name`` of every sub-env's episode (``last_verify``, ``trajectory``, ``task``, ...)."""
        return [getattr(e, name, None) for e in self.episodes]

    async def _areset(self, seeds: list[int | None], mask: np.ndarray,
                      task_indices: list[int | None] | None) -> dict[int, tuple[list, dict]]:
        return await self.reset_some(seeds, mask, task_indices)

    async def _astep(self, actions: list[Any]) -> list[SubEnvStep]:
        return await self.play_turns(self.check_actions(actions))

    # ---- internals -------------------------------------------------------------------------

    async def _start(self, i: int, task_index: int | None = None) -> tuple[list, dict]:
        options = None if task_index is None else {"task_index": task_index}
        index, row = pick_task(self.rows, self._rngs[i], options)
        client = self.clients[i % len(self.clients)]
        try:
            self.episodes[i], obs, info = await start_episode(client, self.protocol, row, index, self.max_steps,
                                                              episode_reward=self.episode_reward)
        except ServerError as exc:
            self._needs_reset[i] = True
            return [], {"task_index": -1 if index is None else index, "error": str(exc)[:1000]}
        self._needs_reset[i] = False
        return obs, info

    async def _one_step(self, i: int, items: list[dict[str, Any]] | None) -> SubEnvStep:
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

    async def play_turns(self, turns: list[Turn]) -> list[SubEnvStep]:
        """Play checked turns (:meth:`check_actions`) on every sub-env at once.

        Returns, per sub-env, its step result and, when it ended and autoreset in the same step
        (``SAME_STEP``), its final observation and info; :meth:`batch` batches them.
        """
        return await asyncio.gather(*(self._one_step(i, t) for i, t in enumerate(turns)))

