"""Scripted player for ``textarena_guess_the_number``: binary search on the game's higher/lower hints.

With ``correct=True`` it halves the range the hints leave (a number from 1 to 20 in at most 5
guesses: reward 1). With ``correct=False`` it guesses the low end and climbs one at a time,
skipping nothing it has tried (found only when the number is small).

Example:
    >>> said = ["guess the number between 1 and 20", "[Player 0] [10]\\n[GAME] The target number is higher."]
    >>> scripted_action({}, [], observations=said)[0]["content"][0]["text"]
    '[15]'
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["scripted_action"]

_RANGE = re.compile(r"between (\d+) and (\d+)")
_HINT = re.compile(r"\[(\d+)\]\s*\n\[GAME\] The target number is (higher|lower)")


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next guess, from the range and every hint so far."""
    text = "\n".join(observations)
    bounds = _RANGE.search(text)
    low, high = (int(bounds.group(1)), int(bounds.group(2))) if bounds else (1, 20)
    hints = _HINT.findall(text)
    if not correct:
        guess = low + len(hints)
    else:
        for number, way in hints:
            if way == "higher":
                low = max(low, int(number) + 1)
            else:
                high = min(high, int(number) - 1)
        guess = (low + high) // 2
    return [assistant_message(f"[{guess}]", f"msg_t{len(observations)}")]
