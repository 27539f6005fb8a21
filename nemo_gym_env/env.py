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

Semantics (DESIGN.md §4): ``reset`` picks a task row (same seed, same task), opens a fresh
session with ``POST /seed_session`` and returns the row's input items. ``step`` takes the
model's turn (output items, a whole ``Response``, or raw text), sends its tool calls to the
server in order and returns their outputs. A turn without tool calls ends the episode
through ``POST /verify`` (``terminated``); reaching ``max_steps`` verifies too
(``truncated``). A server that fails mid-episode truncates it with ``info["error"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from . import launch

__all__ = ["ActionError", "NemoGymEnv", "ServerHandle", "pick_task", "resolve_server"]

# The rest of what the env uses (openai's Responses types and the pydantic models built on
# them: ~1 s to import, longer on a busy machine) is imported by _import_runtime, which
# NemoGymEnv calls while its embedded server process boots, so the two overlap instead of
# running one after the other. The names below become module globals then (or on first
# access from outside, through __getattr__).
_RUNTIME = ("ActionError", "normalize_action", "ResourcesClient", "load_rows", "Episode", "StepResult",
            "background_loop", "items_to_text", "JsonItems", "ResponsesAction", "Response")


def _import_runtime() -> None:
    """Import the env's own modules and bind their names in this module (idempotent, cheap once done)."""
    global ActionError, normalize_action, ResourcesClient, load_rows, Episode, StepResult
    global background_loop, items_to_text, JsonItems, ResponsesAction, Response
    from .actions import ActionError, normalize_action
    from .client import ResourcesClient
    from .dataset import load_rows
    from .episode import Episode, StepResult
    from .loop import background_loop
    from .parser import items_to_text
    from .spaces import JsonItems, ResponsesAction
    from .types import Response


def __getattr__(name: str) -> Any:
    if name in _RUNTIME:
        _import_runtime()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class ServerHandle:
    """Where an env's server is, and whether the env holds a shared embedded server."""

    url: str
    name: str
    default_dataset: Path | None
    acquired: str | None

    def release(self) -> None:
        """Give back the shared embedded server, if this handle holds one (idempotent)."""
        if self.acquired is not None:
            launch.release_server(self.acquired)
            self.acquired = None


def resolve_server(
    server: str | None,
    base_url: str | None,
    config_paths: Sequence[str] | None,
    *,
    while_starting: Callable[[], object] | None = None,
) -> ServerHandle:
    """Find or start the server an env talks to: a URL, a config, or a bundled name.

    ``while_starting`` runs while a server this call starts boots (see
    :func:`~nemo_gym_env.launch.acquire_server`).
    """
    from . import catalog
    from .config import load_config, server_specs

    if base_url is not None:
        return ServerHandle(base_url.rstrip("/"), server or base_url, None, None)
    if config_paths:
        specs = server_specs(load_config(list(config_paths), env_yaml=None))
        if server is not None:
            specs = [s for s in specs if server in (s.instance_name, s.impl_name)]
        if len(specs) != 1:
            raise ValueError(f"config_paths define {len(specs)} matching resources servers; name one with server=...")
        spec, default = specs[0], None
    elif server is not None:
        spec, default = catalog.bundled_spec(server), catalog.bundled_dataset(server)
    else:
        raise ValueError("give a bundled server name, a base_url, or config_paths")
    process = launch.acquire_server(spec, while_starting=while_starting)
    return ServerHandle(process.url, spec.instance_name, default, spec.instance_name)


def task_rows(handle: ServerHandle, dataset: str | Path | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The task rows an env plays: ``dataset``, or the bundled server's own example data."""
    from .dataset import load_rows

    if dataset is None and handle.default_dataset is None:
        raise ValueError("dataset is required with base_url or config_paths: a JSONL path or a list of rows")
    return load_rows(handle.default_dataset if dataset is None else dataset)


def action_space_of(rows: Sequence[dict[str, Any]]) -> Any:
    """The action space of an env over ``rows``: Responses-API output, tools named by the first row."""
    from .spaces import ResponsesAction

    tools = rows[0]["responses_create_params"].get("tools") or []
    return ResponsesAction(tool_names=tuple(t.get("name", "") for t in tools if isinstance(t, dict)))


def pick_task(rows: Sequence[dict[str, Any]], rng: np.random.Generator,
              options: dict[str, Any] | None) -> tuple[int | None, dict[str, Any]]:
    """The task of a reset: ``options["row"]``, ``options["task_index"]``, or drawn from ``rng``."""
    options = options or {}
    if "row" in options:
        from .dataset import load_rows

        return options.get("task_index"), load_rows([options["row"]])[0]
    if "task_index" in options:
        index = options["task_index"]
        if isinstance(index, np.integer):
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(rows):
            raise ValueError(f"options['task_index'] must be an int in [0, {len(rows)}), got {index!r}")
        return index, rows[index]
    index = int(rng.integers(len(rows)))
    return index, rows[index]


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
            ``"raise"`` raises :class:`~nemo_gym_env.client.ServerError`.
        render_mode: ``"ansi"`` renders the episode as text.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        server: str | None = None,
        *,
        base_url: str | None = None,
        dataset: str | Path | Sequence[dict[str, Any]] | None = None,
        config_paths: Sequence[str] | None = None,
        max_steps: int = 16,
        request_timeout_s: float = 60.0,
        verify_timeout_s: float = 300.0,
        on_server_error: str = "truncate",
        render_mode: str | None = None,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if on_server_error not in ("truncate", "raise"):
            raise ValueError(f"on_server_error must be 'truncate' or 'raise', got {on_server_error!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self.max_steps = max_steps
        self.on_server_error = on_server_error
        self._handle: ServerHandle | None = None
        self._handle = resolve_server(server, base_url, config_paths, while_starting=_import_runtime)
        try:
            _import_runtime()  # done already if this call started the server
        except BaseException:
            self.close()
            raise
        try:
            self.rows = task_rows(self._handle, dataset)
        except Exception:
            self.close()
            raise
        self.base_url = self._handle.url
        self.server_name = self._handle.name
        self.client = ResourcesClient(self.base_url, timeout_s=request_timeout_s, verify_timeout_s=verify_timeout_s)
        self.observation_space = JsonItems()
        self.action_space = action_space_of(self.rows)
        self.episode: Episode | None = None

    # ---- Gymnasium API -----------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list, dict]:
        """Start an episode on a task; see the module docstring."""
        episode = self._new_episode(seed, options)
        return background_loop().run(episode.start())

    def step(self, action: Any) -> StepResult:
        """Play one model turn; see the module docstring."""
        items = self._check_step(action)
        return self._after_step(background_loop().run(self.episode.play(items)))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list, dict]:
        """Async :meth:`reset`, for trainers with their own event loop."""
        episode = self._new_episode(seed, options)
        return await background_loop().run_async(episode.start())

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

    def _new_episode(self, seed: int | None, options: dict[str, Any] | None) -> Episode:
        super().reset(seed=seed)
        index, row = pick_task(self.rows, self.np_random, options)
        self.episode = Episode(self.client, row, index, self.max_steps)
        return self.episode

    def _check_step(self, action: Any) -> list[dict[str, Any]]:
        if self.episode is None or self.episode.done:
            raise gym.error.ResetNeeded("the episode has ended (or never started): call reset() before step()")
        return normalize_action(action, turn=self.episode.turn)

    def _after_step(self, result: StepResult) -> StepResult:
        if self.episode.error is not None and self.on_server_error == "raise":
            raise self.episode.error
        return result
