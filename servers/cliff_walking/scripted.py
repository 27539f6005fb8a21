"""Scripted player for ``cliff_walking``: up from the start, right along the row above the cliff, down to the goal.

With ``correct=True`` that path (13 steps, return -13). With ``correct=False`` it walks ``right``
from the start into the cliff, every turn. Reads where it stands from the observation.

Example:
    >>> scripted_action({}, [], observations=["You are at row 4, column 1."])[0]["content"][0]["text"]
    '<action>up</action>'
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["scripted_action"]

_WHERE = re.compile(r"You are at row (\d+), column (\d+)\.")
ROWS, COLUMNS = 4, 12


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next move, from the latest observation."""
    found = _WHERE.findall(observations[-1] if observations else "")
    r, c = (int(x) for x in found[-1]) if found else (ROWS, 1)
    if not correct:
        move = "right"
    elif c == COLUMNS:
        move = "down"
    elif r == ROWS:
        move = "up"
    else:
        move = "right" if r == ROWS - 1 else "down"
    return [assistant_message(f"<action>{move}</action>", f"msg_t{len(observations)}")]
