"""Deterministic scripted player for ``guess_number`` (tests, quickstart, benchmarks).

Not a model: it reads the row's ``target``, ``low``, ``high`` and ``max_guesses``. With
``correct=True`` it guesses the target at once (return 1.0). With ``correct=False`` it never
guesses the target but every guess is one the hints still allow (0.0 per step, return 0.0):
an end of the range the hints still allow, the low and high ends alternately, never the
target (:func:`wrong_guesses`). The turn is told by the number of the server's messages in ``history``.

Example:
    >>> row = {"low": 1, "high": 10, "target": 2, "max_guesses": 4}
    >>> scripted_action(row, [])[0]["content"][0]["text"]
    '<guess>2</guess>'
    >>> [wrong_guesses(row)[i] for i in range(4)]
    [1, 10, 9, 8]
"""

from __future__ import annotations

from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message, field

__all__ = ["scripted_action", "wrong_guesses"]


def wrong_guesses(row: dict[str, Any]) -> list[int]:
    """The guesses of ``correct=False`` play, in order.

    The player keeps the range the hints still allow and guesses one of its ends, the low end
    and the high end alternately (the other when that end is the target), so no guess is ruled
    out and none is right.
    """
    low, high, target = int(row["low"]), int(row["high"]), int(row["target"])
    guesses: list[int] = []
    while len(guesses) < int(row.get("max_guesses") or 6) and low < high:
        ends = (low, high) if len(guesses) % 2 == 0 else (high, low)
        guess = ends[0] if ends[0] != target else ends[1]
        guesses.append(guess)
        low, high = (guess + 1, high) if guess < target else (low, guess - 1)
    return guesses


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True) -> list[dict[str, Any]]:
    """Next action (a list of Responses output item dicts) for the episode so far.

    Args:
        row: The dataset row being played (``target``, ``low``, ``high``, ``max_guesses``).
        history: The items the environment has shown since reset (the server's hints, as user
            messages); empty on the first step.
        correct: Guess the target now (reward 1.0), or make allowed wrong guesses only (0.0).
    """
    turn = sum(1 for item in history if field(item, "role") == "user")
    if correct:
        guess = int(row["target"])
    else:
        guesses = wrong_guesses(row)
        guess = guesses[min(turn, len(guesses) - 1)]
    return [assistant_message(f"<guess>{guess}</guess>", f"msg_t{turn}")]
