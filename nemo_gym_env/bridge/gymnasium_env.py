"""Any ``gymnasium.Env`` served as a Gymnasium-protocol resources server.

Config (the server's YAML block, or ``nemo-gym-env serve gymnasium:ENV_ID +key=value``)::

    frozen_lake:
      resources_servers:
        gymnasium_env:
          entrypoint: app.py              # the bundled ones; `gymnasium:ID` targets need none
          env_id: FrozenLake-v1           # a registered id, or my_package.envs:MyEnv
          env_kwargs: {is_slippery: true}
          formatter: my_package.text:describe    # optional: (env, observation, info) -> str
          action_names: [left, down, right, up]  # optional, Discrete spaces
          invalid_penalty: -0.1           # optional, default 0.0

Each session gets its own env, made at ``/reset`` and reset with the row's ``seed``
(:func:`~nemo_gym_env.bridge.hosted.row_seed`), and closed with the session. Observations are
text: the user's ``formatter``, else the bridge's words for Gymnasium's toy-text envs
(:mod:`~nemo_gym_env.bridge.toy_text`), else ``render()`` of an env that renders ``"ansi"``
(terminal colour codes removed), else the observation as JSON. The first observation ends with
the answer format (:class:`~nemo_gym_env.bridge.actions.ActionFormat`); ``reward``,
``terminated`` and ``truncated`` are the env's own. The env, its ``action_names`` (or the
toy-text names) and the formatter are checked when the server is built, so a wrong id, an
import that fails or a space with no text form stops the server before it serves.

The prompt a task row states (:func:`task_prompt`) is the env's rules (``instructions``, or the
toy-text rules) and the same answer format; :mod:`~nemo_gym_env.bridge.datasets` writes rows with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import Field, PrivateAttr

from nemo_gym_env.bridge.actions import ActionFormat
from nemo_gym_env.bridge.hosted import Game, HostedConfig, HostedEnvServer, plain
from nemo_gym_env.bridge.loading import env_class, load_object, make_gym_env, render_modes
from nemo_gym_env.bridge.toy_text import describe, toy_text_of
from nemo_gym_env.errors import ConfigError

__all__ = ["GymnasiumEnvConfig", "GymnasiumEnvServer", "task_prompt"]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class GymnasiumEnvConfig(HostedConfig):
    """What env to host and how it reads and writes text."""

    env_id: str = Field(min_length=1)
    """A registered Gymnasium id (``FrozenLake-v1``) or ``module:Class`` of a ``gymnasium.Env``."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gym.make`` / the class."""
    max_episode_steps: int | None = Field(default=None, ge=1)
    """Wrap in ``TimeLimit`` (a registered id keeps its own limit otherwise)."""
    formatter: str | None = None
    """``module:function(env, observation, info) -> str``: the observation as text."""
    action_names: list[str] | None = None
    """One name per action of a ``Discrete`` space (the toy-text envs have theirs)."""
    action_parser: str | None = None
    """``module:function(text) -> action`` for a space with no built-in text form."""
    action_hint: str = ""
    """What an answer for ``action_parser`` looks like, for the prompt."""
    instructions: str | None = None
    """The env's rules for the prompt (the toy-text envs have theirs)."""


class GymnasiumEnvServer(HostedEnvServer):
    """A ``gymnasium.Env`` behind ``/reset`` and ``/step``; see the module docstring."""

    config: GymnasiumEnvConfig

    _format: ActionFormat = PrivateAttr()
    _observe: Callable[[Any, Any, dict], str] = PrivateAttr()
    _render_mode: str | None = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        self._observe, self._render_mode = _observer(self.config)
        probe = self._make()
        try:
            self._format = _action_format(self.config, probe)
        finally:
            probe.close()

    def _make(self) -> Any:
        cfg = self.config
        return make_gym_env(cfg.env_id, cfg.env_kwargs, render_mode=self._render_mode,
                            max_episode_steps=cfg.max_episode_steps)

    async def open_game(self, row: dict[str, Any], seed: int) -> tuple[Game, str, dict[str, Any]]:
        """A new env, reset with ``seed`` (and the row's ``options``); its first observation and the format."""
        env = self._make()
        try:
            observation, info = env.reset(seed=seed, options=row.get("options"))
            text = self._observe(env, observation, info)
        except BaseException:
            env.close()
            raise
        return Game(env, seed, {}), f"{text}\n\n{self._format.describe()}", {"env_id": self.config.env_id,
                                                                            **plain(info)}

    def parse_action(self, game: Game, text: str) -> Any:
        """The action in ``text``, read by the space's :class:`ActionFormat`."""
        return self._format.parse(text)

    async def play(self, game: Game, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``env.step(action)``, its observation as text."""
        observation, reward, terminated, truncated, info = game.env.step(action)
        shown = action.tolist() if hasattr(action, "tolist") else action
        name = self._format.names[int(action) - int(self._format.space.start)] if self._format.names else None
        return (self._observe(game.env, observation, info), reward, terminated, truncated,
                {"action": shown, **({"action_name": name} if name else {}), **plain(info)})

    def action_format_text(self, game: Game) -> str:
        """The answer format."""
        return self._format.describe()

    @property
    def action_format(self) -> ActionFormat:
        """How this server reads a turn (the format its prompts state)."""
        return self._format


def _observer(cfg: GymnasiumEnvConfig) -> tuple[Callable[[Any, Any, dict], str], str | None]:
    """``(observation -> text, render mode to make the env with)``."""
    if cfg.formatter:
        formatter = load_object(cfg.formatter, "formatter")
        if not callable(formatter):
            raise ConfigError(f"formatter {cfg.formatter!r} is not callable")
        return (lambda env, obs, info: str(formatter(env.unwrapped, obs, info))), None
    cls = env_class(cfg.env_id)
    if toy_text_of(cls) is not None:
        return (lambda env, obs, info: describe(env.unwrapped, obs, info)), None
    if "ansi" in render_modes(cls):
        return (lambda env, obs, info: _ANSI.sub("", str(env.render())).rstrip()), "ansi"
    return (lambda env, obs, info: "Observation: " + json.dumps(plain(obs))), None


def _action_format(cfg: GymnasiumEnvConfig, env: Any) -> ActionFormat:
    parser = load_object(cfg.action_parser, "action_parser") if cfg.action_parser else None
    known = toy_text_of(env.unwrapped)
    names = cfg.action_names if cfg.action_names is not None else (known.action_names if known else None)
    return ActionFormat.for_space(env.action_space, names=names, parser=parser, hint=cfg.action_hint)


def task_prompt(cfg: GymnasiumEnvConfig, action_format: ActionFormat) -> str:
    """The system prompt of a task row: the env's rules and the answer format."""
    if cfg.instructions:
        rules = cfg.instructions
    else:
        known = toy_text_of(env_class(cfg.env_id))
        rules = known.rules if known else (f"You act in the environment {cfg.env_id}, one action per turn. After "
                                           "each action you see what happened; the rewards add up to your score.")
    return f"{rules}\n\n{action_format.describe()}"

