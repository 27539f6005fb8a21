"""What every hosted env shares: one game per session, seeded from the row, failures kept to their episode.

A *hosted* env is someone else's environment (a ``gymnasium.Env``, a TextArena game) served as a
Gymnasium-protocol resources server (:class:`~nemo_gym_env.server.gymnasium.GymnasiumServer`:
``POST /reset``, ``POST /step``). :class:`HostedEnvServer` holds what does not depend on whose
env it is; a subclass says how to open a game, read an action and play it:

- **one game per session**, made at ``/reset`` and closed when the episode ends, when the session
  is reset again, or when the session store drops it (idle TTL, cap);
- **seeded from the row**: the row's ``seed`` (an integer), or, when it has none, a digest of the
  row, so the same row always plays the same episode;
- **a turn that does not parse** is not played: the reason and the format are the next
  observation, the step's reward is ``invalid_penalty`` (0 by default, so returns stay the raw
  env's), and after ``max_invalid_turns`` such turns in a row the episode is truncated;
- **an env that raises** in reset or step ends that episode ``truncated``, with the exception's
  type and message and the row's identity in ``info`` (and the server's log); every other
  session goes on. A reward that is not a finite number is such a failure too.

``info`` replies hold plain JSON only (numpy values become numbers and lists, anything else its
text), small enough for a vector env's batching.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException
from starlette.concurrency import run_in_threadpool
from pydantic import Field

from nemo_gym_env.errors import ActionError
from nemo_gym_env.protocol.types import Response
from nemo_gym_env.server.base import BaseResourcesServerConfig
from nemo_gym_env.server.gymnasium import GymnasiumServer, extract_text
from nemo_gym_env.server.sessions import SessionStore

__all__ = ["Game", "HostedConfig", "HostedEnvServer", "plain", "row_seed"]

logger = logging.getLogger("nemo_gym_env.bridge")

_MAX_SEED = 2**63 - 1
_MAX_TEXT = 2000  # longest string kept in an info value
_MAX_ITEMS = 64  # most entries kept of a list or mapping in info


def row_seed(row: dict[str, Any]) -> int:
    """The seed of a row: its ``seed``, else a digest of its content (same row, same seed).

    Example:
        >>> row_seed({"seed": 7}), row_seed({"a": 1}) == row_seed({"a": 1})
        (7, True)

    Raises:
        HTTPException: 422 when ``seed`` is there but is not an integer from 0 to 2**63-1.
    """
    seed = row.get("seed")
    if seed is None:
        digest = hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).digest()
        return int.from_bytes(digest[:4], "big")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise HTTPException(422, f"the row's seed must be an integer from 0 to 2**63-1, got {str(seed)[:40]!r}")
    return seed


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as small, plain JSON: numpy scalars and arrays become numbers and lists."""
    if value is None or isinstance(value, (bool, int, str)):
        return value[:_MAX_TEXT] if isinstance(value, str) else value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if hasattr(value, "tolist") and depth < 4:  # numpy scalar or array
        return plain(value.tolist(), depth + 1)
    if isinstance(value, dict) and depth < 4:
        return {str(k): plain(v, depth + 1) for k, v in list(value.items())[:_MAX_ITEMS]}
    if isinstance(value, (list, tuple, set, frozenset)) and depth < 4:
        return [plain(v, depth + 1) for v in list(value)[:_MAX_ITEMS]]
    return str(value)[:_MAX_TEXT]


@dataclass
class Game:
    """One session's episode: the env itself and what the server counts about it."""

    env: Any
    seed: int
    row: dict[str, Any]
    """The row's identity for errors: its seed and its other short fields."""
    steps: int = 0
    invalid_in_a_row: int = 0
    failed: dict[str, Any] | None = None
    """Set when the env raised: the ``info`` every later step of the episode answers."""
    extra: dict[str, Any] = field(default_factory=dict)
    """A subclass's own per-episode state."""


class HostedConfig(BaseResourcesServerConfig):
    """Config keys every hosted env has."""

    invalid_penalty: float = Field(default=0.0, allow_inf_nan=False)
    """The reward of a turn from which no action could be read (the env is not stepped)."""
    max_invalid_turns: int | None = Field(default=None, ge=1)
    """Truncate the episode after this many unreadable turns in a row (None: never)."""
    python_path: list[str] = Field(default_factory=list)
    """Folders to import the user's modules from (set when the config is checked where they import)."""


class HostedEnvServer(GymnasiumServer):
    """Base of the servers that host another library's env; see the module docstring.

    A subclass implements :meth:`open_game` (make, seed and reset the env), :meth:`parse_action`
    (the model's text -> an action, or :class:`~nemo_gym_env.errors.ActionError`),
    :meth:`play` (one action) and :meth:`close_game`, and may override :meth:`action_format_text`.
    """

    REVERIFY_MODE = "unsupported"  # rewarded step by step; nothing to re-verify

    config: HostedConfig = Field(default_factory=HostedConfig)

    def model_post_init(self, __context: Any) -> None:
        for folder in reversed(self.config.python_path):  # before a subclass imports the user's env
            if folder not in sys.path:
                sys.path.insert(0, folder)
        super().model_post_init(__context)
        # An episode dropped by the store (idle, or over the cap) still has an env to close.
        self._sessions = SessionStore(max_sessions=self.config.max_sessions, ttl_s=self.config.session_ttl_s,
                                      on_drop=self._close_quietly)

    # ---- what a subclass provides -------------------------------------------------------------

    @abstractmethod
    async def open_game(self, row: dict[str, Any], seed: int) -> tuple[Game, str, dict[str, Any]]:
        """Make and reset an env for ``row`` with ``seed``: ``(game, first observation, info)``."""

    @abstractmethod
    def parse_action(self, game: Game, text: str) -> Any:
        """The action in the model's ``text``; raises :class:`ActionError` saying why not."""

    @abstractmethod
    async def play(self, game: Game, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Step the env: ``(observation text, reward, terminated, truncated, info)``."""

    def close_game(self, game: Game) -> None:
        """Release the env (default: its ``close()``)."""
        close = getattr(game.env, "close", None)
        if close is not None:
            close()

    def action_format_text(self, game: Game) -> str:
        """The answer format, restated to a turn that does not parse."""
        return ""

    # ---- the protocol -------------------------------------------------------------------------

    async def reset(self, metadata: dict, session_id: str | None = None) -> tuple[str | None, dict]:
        """Open a game for the row (seeded from it); a failure is kept for the episode's first step."""
        seed = row_seed(metadata)
        identity = self._identity(metadata, seed)
        try:
            game, observation, info = await self.open_game(metadata, seed)
        except Exception as exc:  # noqa: BLE001 - the env's failure ends this episode, not the server
            failed = self._failure("reset", exc, identity)
            self.session_state[session_id] = Game(None, seed, identity, failed=failed)
            return f"The environment failed to start: {failed['error']}", failed
        game.row = identity
        self.session_state[session_id] = game
        return observation, {"seed": seed, **plain(info)}

    async def step(self, action: Response, metadata: dict,
                   session_id: str | None = None) -> tuple[str | None, float, bool, bool, dict]:
        """Read the action from the turn and play it; see the module docstring for what else can happen."""
        game: Game | None = self.session_state.get(session_id)
        if game is None:  # dropped by the store between two steps (idle past its TTL, or over the cap)
            failed = {"error": "this episode's state expired (idle too long, or too many sessions); reset"}
            return failed["error"], 0.0, False, True, failed
        if game.failed is not None:
            return f"The environment failed: {game.failed['error']}", 0.0, False, True, game.failed
        game.steps += 1
        try:
            # Off the event loop: a long turn (or a slow parser of the user's) must not stall other sessions.
            move = await run_in_threadpool(self.parse_action, game, extract_text(action))
        except ActionError as exc:
            game.invalid_in_a_row += 1
            limit = self.config.max_invalid_turns
            truncated = limit is not None and game.invalid_in_a_row >= limit
            info = {"invalid_action": str(exc), "invalid_in_a_row": game.invalid_in_a_row, "step": game.steps}
            observation = f"Your answer was not read: {exc}. {self.action_format_text(game)}".strip()
            return observation, float(self.config.invalid_penalty), False, truncated, info
        game.invalid_in_a_row = 0
        try:
            observation, reward, terminated, truncated, info = await self.play(game, move)
            reward = float(reward)
            if not math.isfinite(reward):
                raise ValueError(f"the env returned the reward {reward!r}, not a finite number")
        except Exception as exc:  # noqa: BLE001 - the env's failure ends this episode, not the server
            game.failed = self._failure("step", exc, game.row)
            return f"The environment failed: {game.failed['error']}", 0.0, False, True, game.failed
        return observation, reward, bool(terminated), bool(truncated), {"step": game.steps, **plain(info)}

    # ---- sessions -----------------------------------------------------------------------------

    def _cleanup_session(self, session_id: str | None) -> None:
        game = self.session_state.pop(session_id, None)
        if game is not None:
            self._close_quietly(game)

    def _close_quietly(self, game: Game) -> None:
        if game.env is None:
            return
        try:
            self.close_game(game)
        except Exception:  # an env that fails to close must not fail the request that ended it
            logger.exception("%s: closing the env of row %s failed", self.config.name, game.row)
        game.env = None

    # ---- failures -----------------------------------------------------------------------------

    @staticmethod
    def _identity(row: dict[str, Any], seed: int) -> dict[str, Any]:
        short = {k: v for k, v in row.items()
                 if isinstance(v, (int, float, str, bool)) and len(str(v)) <= 200 and not k.startswith("_ng_")}
        return {**dict(list(short.items())[:12]), "seed": seed}

    def _failure(self, where: str, exc: BaseException, identity: dict[str, Any]) -> dict[str, Any]:
        message = (str(exc).strip().splitlines() or [""])[0][:500]
        logger.error("%s: the env raised in %s on row %s: %s: %s", self.config.name, where, identity,
                     type(exc).__name__, message, exc_info=exc)
        return {"error": f"{type(exc).__name__} in {where}: {message}", "exception": type(exc).__name__,
                "where": where, "row": identity}
