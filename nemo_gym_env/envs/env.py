"""``NemoGymEnv``: a NeMo-Gym-style resources server behind the Gymnasium API.

Example:
    >>> import gymnasium as gym, nemo_gym_env
    >>> env = gym.make("NemoGym/example_single_tool_call-v0")
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    >>> obs[0]["output"]
    '{"city":"Oslo","weather_description":"The weather in Oslo is cold."}'
    >>> obs, reward, terminated, truncated, info = env.step("It is cold in Oslo.")
    >>> reward, terminated
    (1.0, True)
    >>> env.close()

Semantics (``docs/architecture.md``): ``reset`` picks a task row (same seed, same task), opens a fresh
session with ``POST /seed_session`` and returns the row's input items. ``step`` takes the
model's turn (output items, a whole ``Response``, or raw text), sends its tool calls to the
server in order and returns their outputs. A turn without tool calls ends the episode
through ``POST /verify`` (``terminated``); reaching ``max_steps`` verifies too
(``truncated``). A server that fails mid-episode truncates it with ``info["error"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.episode import EPISODE_REWARDS, Episode, StepResult
from nemo_gym_env.envs.sources import ServerHandle, resolve_server
from nemo_gym_env.envs.spaces import JsonItems, action_space_for
from nemo_gym_env.envs.tasks import pick_task, task_rows
from nemo_gym_env.envs.traits import open_episode, server_traits, start_episode
from nemo_gym_env.errors import ActionError
from nemo_gym_env.protocol.defaults import MAX_STEPS, REQUEST_TIMEOUT_S, VERIFY_TIMEOUT_S
from nemo_gym_env.protocol.parser import items_to_text
from nemo_gym_env.protocol.types import Response

__all__ = ["ActionError", "NemoGymEnv", "ServerHandle", "pick_task", "resolve_server"]


class NemoGymEnv(gym.Env[list, Any]):
    """A resources server as a Gymnasium environment.

    Args:
        server: Name of a bundled server (``example_multi_step``...). Without ``base_url`` the
            env starts it on loopback, shared by every env of this process.
        base_url: URL of a running resources server (ours or NeMo Gym's) to use instead.
        dataset: JSONL path or list of task rows. Defaults to the bundled server's examples.
        config_paths: NeMo-Gym-style YAML configs to launch the server from (with ``server``
            naming the instance when they define several).
        max_steps: Model turns before the episode is verified and truncated.
        request_timeout_s: Per tool-call timeout; a hung server truncates the episode.
        verify_timeout_s: Timeout of ``/verify``.
        on_server_error: ``"truncate"`` (default) ends the episode with ``info["error"]``;
            ``"raise"`` raises :class:`~nemo_gym_env.errors.ServerError`.
        render_mode: ``"ansi"`` renders the episode as text.
        protocol: ``"auto"`` (default: told from the server, see :mod:`nemo_gym_env.envs.traits`),
            ``"resources"`` (``/seed_session``, tools, ``/verify``) or ``"gymnasium"``
            (``/reset``, ``/step``: the server rewards every step).
        episode_reward: ``"verify"`` (default): an episode's reward (``info["reward"]`` at its
            end) is the ``/verify`` reward; ``"sum"``: the ``/verify`` reward plus every step reward
            the tools gave. Either way ``step`` returns each turn's step reward, and the last
            step adds the ``/verify`` reward.
        server_handle: A server already resolved by :func:`~nemo_gym_env.envs.sources.resolve_server`
            (``gym.make`` passes the one it started); the env releases it on :meth:`close`.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        server: str | None = None,
        *,
        base_url: str | None = None,
        dataset: str | Path | Sequence[dict[str, Any]] | None = None,
        config_paths: Sequence[str] | None = None,
        max_steps: int = MAX_STEPS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        verify_timeout_s: float = VERIFY_TIMEOUT_S,
        on_server_error: str = "truncate",
        render_mode: str | None = None,
        protocol: str = "auto",
        episode_reward: str = "verify",
        server_handle: ServerHandle | None = None,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if episode_reward not in EPISODE_REWARDS:
            raise ValueError(f"episode_reward must be one of {EPISODE_REWARDS}, got {episode_reward!r}")
        self.episode_reward = episode_reward
        if on_server_error not in ("truncate", "raise"):
            raise ValueError(f"on_server_error must be 'truncate' or 'raise', got {on_server_error!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self.max_steps = max_steps
        self.on_server_error = on_server_error
        self._handle: ServerHandle | None = None
        self._handle = server_handle or resolve_server(server, base_url, config_paths)
        try:
            self.rows = task_rows(self._handle, dataset)
        except Exception:
            self.close()
            raise
        self.base_url = self._handle.url
        self.server_name = self._handle.name
        self.client = ResourcesClient(self.base_url, timeout_s=request_timeout_s, verify_timeout_s=verify_timeout_s)
        self.protocol = protocol
        self.observation_space = JsonItems()
        self.action_space = action_space_for(self.rows)
        self.episode: Episode | None = None

    # ---- Gymnasium API -----------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list, dict]:
        """Start an episode on a task; see the module docstring."""
        return background_loop().run(self._start(*self._pick(seed, options)))

    def step(self, action: Any) -> StepResult:
        """Play one model turn; see the module docstring."""
        items = self._check_step(action)
        return self._after_step(background_loop().run(self.episode.play(items)))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list, dict]:
        """Async :meth:`reset`, for trainers with their own event loop."""
        return await background_loop().run_async(self._start(*self._pick(seed, options)))

    async def astep(self, action: Any) -> StepResult:
        """Async :meth:`step`."""
        items = self._check_step(action)
        return self._after_step(await background_loop().run_async(self.episode.play(items)))

    def render(self) -> str | None:
        """The episode so far as text (``render_mode="ansi"``)."""
        if self.render_mode != "ansi" or self.episode is None:
            return None
        lines = [f"task {self.episode.task_index} on {self.server_name}"]
        for item in self.episode.trajectory:
            if item["type"] == "function_call_output":
                lines.append(f"[tool output {item['call_id']}] {item['output']}")
            else:
                lines.append(items_to_text([item]))
        return "\n".join(lines)

    def close(self) -> None:
        """Release the shared server (stopped when the last env using it closes); safe to call twice."""
        if self._handle is not None:
            self._handle.release()

    # ---- results -----------------------------------------------------------------------

    @property
    def task(self) -> dict[str, Any] | None:
        """The current task row."""
        return None if self.episode is None else self.episode.task

    @property
    def last_verify(self) -> dict[str, Any] | None:
        """The full ``/verify`` reply of the last finished episode."""
        return None if self.episode is None else self.episode.last_verify

    @property
    def response(self) -> Response | None:
        """The episode so far as a Responses-API ``Response`` (every model and tool item)."""
        return None if self.episode is None else self.episode.response

    # ---- internals -----------------------------------------------------------------------

    def open_episode(self, row: dict[str, Any], task_index: int | None = None,
                     max_steps: int | None = None) -> Episode:
        """A new, unstarted episode of ``row`` on this env's server, speaking its protocol.

        For code that drives episodes itself (the trainer adapters); ``await episode.start()``
        on the background loop begins it.
        """
        traits = background_loop().run(server_traits(self.client, self.protocol))
        return open_episode(traits, self.client, row, task_index, max_steps or self.max_steps,
                            episode_reward=self.episode_reward)

    def _pick(self, seed: int | None, options: dict[str, Any] | None) -> tuple[int | None, dict[str, Any]]:
        super().reset(seed=seed)
        return pick_task(self.rows, self.np_random, options)

    async def _start(self, index: int | None, row: dict[str, Any]) -> tuple[list, dict]:
        self.episode, observation, info = await start_episode(self.client, self.protocol, row, index, self.max_steps,
                                                              episode_reward=self.episode_reward)
        return observation, info

    def _check_step(self, action: Any) -> list[dict[str, Any]]:
        if self.episode is None or self.episode.done:
            raise gym.error.ResetNeeded("the episode has ended (or never started): call reset() before step()")
        return normalize_action(action, turn=self.episode.turn)

    def _after_step(self, result: StepResult) -> StepResult:
        if self.episode.error is not None and self.on_server_error == "raise":
            raise self.episode.error
        return result
