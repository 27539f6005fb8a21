"""Scripted player for ``taxi``: drives a shortest path to the passenger, picks them up, drives them home.

With ``correct=True`` that plan, read afresh from every observation (the map with its walls, where
the taxi, the passenger and the destination are). With ``correct=False`` it drives ``north``
forever (every step -1, until the time limit).

Example:
    >>> text = ("The map (T is the taxi):\\n+---------+\\n|R: |T: :G|\\n| : | : : |\\n| : : : : |\\n| | : | : |\\n"
    ...         "|Y| : |B: |\\n+---------+\\nThe taxi is at row 1, column 3. The passenger is waiting at R (row 1, "
    ...         "column 1). The destination is Y (row 5, column 1).")
    >>> scripted_action({}, [], observations=[text])[0]["content"][0]["text"]
    '<action>south</action>'
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["next_move", "scripted_action"]

_TAXI = re.compile(r"The taxi is at row (\d+), column (\d+)\.")
_WAITING = re.compile(r"waiting at \w \(row (\d+), column (\d+)\)")
_DESTINATION = re.compile(r"The destination is \w \(row (\d+), column (\d+)\)")


def next_move(walls: list[str], taxi: tuple[int, int], target: tuple[int, int], carrying: bool) -> str:
    """The first move of a shortest drive from ``taxi`` to ``target`` on the map ``walls``; at the target, the pickup or dropoff."""
    if taxi == target:
        return "dropoff" if carrying else "pickup"
    rows, cols = len(walls) - 2, (len(walls[0]) - 1) // 2

    def moves(pos: tuple[int, int]) -> list[tuple[str, tuple[int, int]]]:
        r, c = pos
        found = []
        if r + 1 < rows:
            found.append(("south", (r + 1, c)))
        if r > 0:
            found.append(("north", (r - 1, c)))
        if c + 1 < cols and walls[r + 1][2 * c + 2] == ":":
            found.append(("east", (r, c + 1)))
        if c > 0 and walls[r + 1][2 * c] == ":":
            found.append(("west", (r, c - 1)))
        return found

    first: dict[tuple[int, int], str | None] = {taxi: None}
    queue = deque([taxi])
    while queue:
        pos = queue.popleft()
        if pos == target:
            return first[pos] or "north"
        for name, nxt in moves(pos):
            if nxt not in first:
                first[nxt] = first[pos] or name
                queue.append(nxt)
    return "north"


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next move, from the latest observation."""
    text = observations[-1] if observations else ""
    turn = f"msg_t{len(observations)}"
    taxi, destination = _TAXI.findall(text), _DESTINATION.findall(text)
    if not correct or not taxi or not destination:
        return [assistant_message("<action>north</action>", turn)]
    walls = [line for line in text.splitlines() if line[:1] in "+|"]
    waiting = _WAITING.findall(text)
    here = tuple(int(x) - 1 for x in taxi[-1])
    goal = tuple(int(x) - 1 for x in (waiting[-1] if waiting else destination[-1]))
    move = next_move(walls, here, goal, carrying=not waiting)
    return [assistant_message(f"<action>{move}</action>", turn)]
