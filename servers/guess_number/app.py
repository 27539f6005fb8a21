"""``guess_number``: a number-guessing game on the Gymnasium protocol (``POST /reset``, ``POST /step``).

The server keeps a whole number between the row's ``low`` and ``high`` (the row's ``target``)
and the player has ``max_guesses`` turns to find it. Each turn the model answers with
``<guess>N</guess>`` (the last such tag of its turn counts) and the step is rewarded at once:

==================================================  ========  =====================================
the guess                                           reward    then
==================================================  ========  =====================================
the target                                          +1.0      terminated (``result: "win"``)
a number still possible given the hints so far      0.0       ``"Higher."`` / ``"Lower."``
no ``<guess>`` tag, outside the range, or ruled     -0.1      the hint is repeated
out by an earlier hint
==================================================  ========  =====================================

When the last allowed turn misses, the episode terminates (``result: "lost"``). The return of
an episode is the sum of its step rewards: 1.0 for a win without wasted turns, less for each
invalid guess. A Gymnasium env of it: ``gym.make("NemoGym/guess_number-v0")``.

Written on :class:`~nemo_gym_env.server.gymnasium.GymnasiumServer`, the way NeMo Gym's
``GymnasiumServer`` servers (``blackjack``) are written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from pydantic import Field

from nemo_gym_env.protocol.types import Response
from nemo_gym_env.server import BaseResourcesServerConfig
from nemo_gym_env.server.gymnasium import GymnasiumServer, extract_text

__all__ = ["GuessNumberConfig", "GuessNumberServer", "INVALID_PENALTY", "parse_guess"]

INVALID_PENALTY = -0.1
"""The reward of a turn whose guess is missing, out of range or ruled out by an earlier hint."""

_GUESS = re.compile(r"<guess>\s*(-?\d{1,18})\s*</guess>", re.IGNORECASE)
MAX_RANGE = 10**9
"""The largest ``high - low`` a row may ask for."""


def parse_guess(text: str) -> int | None:
    """The number in the last ``<guess>N</guess>`` tag of ``text``, or None.

    Example:
        >>> parse_guess("Maybe 3? <guess>12</guess> no, <guess> 17 </guess>")
        17
        >>> parse_guess("seventeen") is None
        True
    """
    found = _GUESS.findall(text[-100_000:])
    return int(found[-1]) if found else None


@dataclass
class Game:
    low: int
    high: int
    target: int
    max_guesses: int
    used: int = 0

    def hint(self) -> str:
        left = self.max_guesses - self.used
        return f"The number is from {self.low} to {self.high}. {left} guess{'es' if left != 1 else ''} left."


class GuessNumberConfig(BaseResourcesServerConfig):
    """Server config: the default number of guesses for rows that do not set ``max_guesses``."""

    default_max_guesses: int = Field(default=6, ge=1, le=100)


class GuessNumberServer(GymnasiumServer):
    """The ``guess_number`` Gymnasium-protocol server; see the module docstring."""

    REVERIFY_MODE = "unsupported"  # scored step by step, there is no /verify

    config: GuessNumberConfig = Field(default_factory=GuessNumberConfig)

    async def reset(self, metadata: dict, session_id: str | None = None) -> tuple[str | None, dict]:
        """Start a game from the row's ``low``, ``high``, ``target`` and ``max_guesses``."""
        game = self._game(metadata)
        self.session_state[session_id] = game
        observation = (f"I am thinking of a whole number from {game.low} to {game.high}. You have "
                       f"{game.max_guesses} guesses. Answer with <guess>N</guess>.")
        return observation, {"low": game.low, "high": game.high, "max_guesses": game.max_guesses}

    async def step(self, action: Response, metadata: dict,
                   session_id: str | None = None) -> tuple[str | None, float, bool, bool, dict]:
        """Score one guess: +1.0 and the end for the target, 0.0 and a hint, or -0.1 for an invalid guess."""
        game: Game = self.session_state[session_id]
        guess = parse_guess(extract_text(action))
        game.used += 1
        left = game.max_guesses - game.used
        info: dict[str, Any] = {"guess": guess, "guesses_used": game.used, "guesses_left": left}
        if guess == game.target:
            return None, 1.0, True, False, {**info, "result": "win"}
        valid = guess is not None and game.low <= guess <= game.high
        if valid:
            if guess < game.target:
                game.low, result, said = guess + 1, "higher", "Higher."
            else:
                game.high, result, said = guess - 1, "lower", "Lower."
        else:
            result = "invalid"
            said = ("No <guess>N</guess> in your answer." if guess is None
                    else f"{guess} cannot be it.")
        reward = 0.0 if valid else INVALID_PENALTY
        if left <= 0:
            return None, reward, True, False, {**info, "result": "lost", "last": result, "target": game.target}
        return f"{said} {game.hint()}", reward, False, False, {**info, "result": result}

    def _game(self, row: dict[str, Any]) -> Game:
        try:
            low, high, target = (int(row[key]) for key in ("low", "high", "target"))
            given = row.get("max_guesses")
            max_guesses = self.config.default_max_guesses if given is None else int(given)
        except (KeyError, TypeError, ValueError) as exc:
            raise HTTPException(422, f"the row needs integers low, high and target (and max_guesses, optional): {exc}") from exc
        if not (low <= target <= high) or high - low > MAX_RANGE or not 1 <= max_guesses <= 100:
            raise HTTPException(422, f"the row needs low <= target <= high, high - low <= {MAX_RANGE}, 1 <= max_guesses <= 100")
        return Game(low, high, target, max_guesses)


if __name__ == "__main__":
    GuessNumberServer.run_webserver()
