"""TextArena games served as Gymnasium-protocol resources servers (``textarena`` from PyPI, extra ``textarena``).

Config (``nemo-gym-env serve textarena:TowerOfHanoi-v0``, or a YAML block)::

    hanoi:
      resources_servers:
        textarena_game:
          entrypoint: app.py
          game: TowerOfHanoi-v0         # any id of textarena's registry
          game_kwargs: {num_disks: 3}   # optional
          player: 0                     # two-player games: the side the model plays
          opponent: builtin             # or my_package.bots:move, or policy (opponent_policy: {...})

Each session plays its own game, reset with the row's seed. TextArena seeds Python's global
``random`` and draws from it while it plays (Sudoku's grid, Minesweeper's mines), so the server
keeps each game's own ``random`` state and swaps it in around every call into the game: two
sessions played interleaved get the same games as each played alone.

The model's turn is the game's action as TextArena reads it (``[A C]``, ``[4]``): the content
of its last ``<action>...</action>`` tag when it has one, else the whole text. The game judges
moves itself (an invalid move gets TextArena's own notice and, past its allowance, ends the
game). Observations are the messages the game sent the model's player since its last turn, one
per line as ``[GAME] ...`` / ``[Player 1] ...``. Rewards are TextArena's: 0 on every step, the
player's final reward (``env.close()``) on the last.

Two-player games are played against a second policy of ours, so that one side is trained:
``opponent: builtin`` (a scripted player shipped for the game, :data:`BUILTIN_OPPONENTS`),
``module:function`` (``function(observation, env) -> move text``), or ``policy`` with
``opponent_policy`` (the keyword arguments of :func:`~nemo_gym_env.policies.factory.make_policy`:
``{kind: local}`` for the embedded model, ``{kind: openai, base_url: ..., model: ...}``).

Which games run offline (textarena 0.7.4, tried): see ``docs/bring_your_env.md``. A game that
wants data from the network (Wordle and Hangman download NLTK corpora) fails at start with one
line saying so.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import random
import re
from collections.abc import Callable
from typing import Any

from pydantic import Field, PrivateAttr

from nemo_gym_env.bridge.actions import action_tags
from nemo_gym_env.bridge.hosted import Game, HostedConfig, HostedEnvServer
from nemo_gym_env.bridge.loading import load_object
from nemo_gym_env.bridge.opponents import BUILTIN_OPPONENTS, PolicyOpponent
from nemo_gym_env.errors import ActionError, ConfigError

__all__ = ["INSTALL", "TextArenaConfig", "TextArenaServer", "make_game", "observation_text"]

INSTALL = "pip install 'nemo-gym-env[textarena]'"

_NETWORK_HINTS = ("nltk", "download", "urlopen", "connection", "resolve", "network", "http")
_MAX_OPPONENT_MOVES = 1000  # per model turn: a game that never hands the turn back is a failure, not a hang


class TextArenaConfig(HostedConfig):
    """What game to host and who plays the other side."""

    game: str = Field(min_length=1)
    """A TextArena id, e.g. ``TowerOfHanoi-v0``, ``Sudoku-v0-easy``, ``TicTacToe-v0``."""
    game_kwargs: dict[str, Any] = Field(default_factory=dict)
    num_players: int | None = Field(default=None, ge=1, le=2)
    """None: found by resetting a game once at start."""
    player: int = Field(default=0, ge=0, le=1)
    """The side the model plays in a two-player game."""
    opponent: str = "builtin"
    """``builtin``, ``module:function`` or ``policy`` (two-player games)."""
    opponent_policy: dict[str, Any] | None = None
    """``make_policy`` keyword arguments when ``opponent`` is ``policy``."""


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise ConfigError(f"TextArena games need the textarena package: {INSTALL} ({exc})") from None
    return textarena


def make_game(game: str, kwargs: dict[str, Any] | None = None) -> Any:
    """A new, unwrapped TextArena env of ``game`` (its ``-raw`` variant when the registry has one).

    Raises:
        ConfigError: textarena is not installed, or has no such game.
    """
    ta = _textarena()
    registry = ta.envs.registration.ENV_REGISTRY
    if game not in registry:
        stem = game.split("-")[0].lower()
        close = sorted(name for name in registry if name.split("-")[0].lower() == stem)[:6]
        raise ConfigError(f"TextArena has no game {game!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                                "; its ids look like TowerOfHanoi-v0"))
    try:
        # Quietly: a game that fetches data (NLTK's downloader) prints its failures; the error below says it.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return ta.make(f"{game}-raw" if f"{game}-raw" in registry else game, **(kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - the game's own failure, as one line
        raise ConfigError(_start_failure(game, exc)) from None


def observation_text(observation: Any, role_names: dict[int, str] | None = None) -> str:
    """TextArena's observation as text: a string as it is, a message list as ``[SENDER] message`` lines."""
    if isinstance(observation, str):
        return observation.strip()
    lines = []
    for entry in observation or []:
        sender, message = entry[0], entry[1]
        name = (role_names or {}).get(sender, "GAME" if sender == -1 else f"Player {sender}")
        lines.append(f"[{name}] {str(message).strip()}")
    return "\n".join(lines)


class _Rng:
    """A game's own ``random`` state, swapped in around each call into the game."""

    def __init__(self) -> None:
        self.state: Any = None

    def __enter__(self) -> None:
        self.outside = random.getstate()
        if self.state is not None:
            random.setstate(self.state)

    def __exit__(self, *exc: object) -> None:
        self.state = random.getstate()
        random.setstate(self.outside)


class TextArenaServer(HostedEnvServer):
    """A TextArena game behind ``/reset`` and ``/step``; see the module docstring."""

    config: TextArenaConfig

    _players: int = PrivateAttr(default=1)
    _opponent: Callable[..., Any] | None = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        self._players = self.config.num_players or self._probe()
        if self._players == 2:
            self._opponent = self._make_opponent()

    # ---- start-up checks ----------------------------------------------------------------------

    def _probe(self) -> int:
        """Reset a game once: how many players it takes; a game that needs the network fails here."""
        env = make_game(self.config.game, self.config.game_kwargs)
        problem = None
        for players in (1, 2):
            try:
                with _Rng(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    env.reset(num_players=players, seed=0)
                return players
            except AssertionError as exc:  # TextArena's states assert the number of players
                problem = exc
            except Exception as exc:  # noqa: BLE001
                raise ConfigError(_start_failure(self.config.game, exc)) from None
        raise ConfigError(f"TextArena game {self.config.game} is not a one- or two-player game: {problem}")

    def _make_opponent(self) -> Callable[..., Any]:
        cfg = self.config
        if cfg.opponent == "builtin":
            found = BUILTIN_OPPONENTS.get(cfg.game.split("-")[0])
            if found is None:
                raise ConfigError(f"{cfg.game} is a two-player game with no builtin opponent here (builtin: "
                                  f"{', '.join(sorted(BUILTIN_OPPONENTS))}); set opponent: module:function, or "
                                  "opponent: policy with opponent_policy: {kind: local}")
            return found
        if cfg.opponent == "policy":
            if not cfg.opponent_policy:
                raise ConfigError("opponent: policy needs opponent_policy (make_policy keyword arguments, e.g. "
                                  "{kind: local})")
            return PolicyOpponent(cfg.opponent_policy)
        found = load_object(cfg.opponent, "opponent")
        if not callable(found):
            raise ConfigError(f"opponent {cfg.opponent!r} is not callable")
        return found

    # ---- the game -----------------------------------------------------------------------------

    async def open_game(self, row: dict[str, Any], seed: int) -> tuple[Game, str, dict[str, Any]]:
        """A new game reset with ``seed``; the opponent moves first when the game says so."""
        env = make_game(self.config.game, self.config.game_kwargs)
        rng = _Rng()
        game = Game(env, seed, {}, extra={"rng": rng, "opponent_moves": 0})
        with rng:
            env.reset(num_players=self._players, seed=seed)
        text = await self._after_opponent(game)
        how = ("Answer with your move as the game asks for it; when you use an <action>...</action> tag, only its "
               "content is read.")
        return game, f"{text}\n\n{how}", {"game": self.config.game, "players": self._players,
                                         "player": self.config.player}

    def parse_action(self, game: Game, text: str) -> str:
        """The content of the last ``<action>`` tag, else the whole turn; an empty turn is no move."""
        tags = action_tags(text[-100_000:])
        move = (tags[-1] if tags else text).strip()
        if not move:
            raise ActionError("your answer was empty")
        return move[:10_000]

    def action_format_text(self, game: Game) -> str:
        """What a move looks like."""
        return "Answer with your move as the game's rules above ask for it."

    async def play(self, game: Game, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The model's move, then the opponent's until it is the model's turn or the game is over."""
        env, rng = game.env, game.extra["rng"]
        with rng:
            done, info = env.step(action=action)
        text = await self._after_opponent(game) if not done else ""
        if done or game.extra.get("done"):
            return self._final(game, text)
        return text, 0.0, False, False, {"turn": game.steps, **_small(info)}

    async def _after_opponent(self, game: Game) -> str:
        """Let the opponent move while it has the turn; then what the model's player sees."""
        env, rng, me = game.env, game.extra["rng"], self.config.player if self._players == 2 else 0
        moves = 0
        while True:
            with rng:
                player, observation = env.get_observation()
            if player == me or self._opponent is None:
                return observation_text(observation, _roles(env))
            moves += 1
            if moves > _MAX_OPPONENT_MOVES:
                raise RuntimeError(f"the opponent moved {moves} times without the turn coming back")
            move = self._opponent(observation_text(observation, _roles(env)), env)
            if inspect.isawaitable(move):
                move = await move
            with rng:
                done, _ = env.step(action=str(move))
            game.extra["opponent_moves"] += 1
            if done:
                game.extra["done"] = True
                # The turn did not come back: what the model's player was told since its move.
                told, env.state.observations[me] = env.state.observations.get(me, []), []
                return observation_text(told, _roles(env))

    def _final(self, game: Game, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        env, rng = game.env, game.extra["rng"]
        with rng:
            rewards, game_info = env.close()
        me = self.config.player if self._players == 2 else 0
        reward = float((rewards or {}).get(me, 0.0))
        mine = (game_info or {}).get(me, {}) if isinstance(game_info, dict) else {}
        reason = str(mine.get("reason") or "")
        info = {"turn": game.steps, "reason": reason[:500], "invalid_move": bool(mine.get("invalid_move")),
                "opponent_moves": game.extra["opponent_moves"]}
        return (f"{text}\n[GAME] {reason}".strip(), reward, True, False, info)

    def close_game(self, game: Game) -> None:
        """TextArena's ``close()`` only reports the rewards; there is nothing to release."""


def _roles(env: Any) -> dict[int, str]:
    state = getattr(env, "state", None)
    mapping = getattr(state, "role_mapping", None)
    return {int(k): str(v) for k, v in mapping.items()} if isinstance(mapping, dict) else {}


def _small(info: Any) -> dict[str, Any]:
    return {str(k): v for k, v in (info or {}).items() if isinstance(v, (int, float, bool, str))} \
        if isinstance(info, dict) else {}


def _start_failure(game: str, exc: BaseException) -> str:
    plain_text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    resource = re.search(r"Resource (\S+) not found", plain_text)  # NLTK's LookupError: a corpus never downloaded
    first = f"NLTK's {resource.group(1)} corpus is not installed" if resource else \
        next((line.strip() for line in plain_text.splitlines() if line.strip(" *")), "")
    text = f"{type(exc).__name__}: {first[:300]}"
    if any(hint in text.lower() for hint in _NETWORK_HINTS) or isinstance(exc, (LookupError, OSError)):
        return (f"TextArena game {game} needs data from the network, which this machine cannot fetch ({text}); "
                "pick a game that runs offline (docs/bring_your_env.md lists them)")
    return f"TextArena game {game} failed to start: {text}"
