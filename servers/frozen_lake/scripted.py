"""Scripted player for ``frozen_lake``: reads the lake from the observation and heads for the goal.

With ``correct=True`` it moves along a shortest path around the holes from where it stands (the
ice may make it slide; it plans again from wherever it lands). With ``correct=False`` it always
goes ``up``. Not a model: tests, benchmarks and the no-model demo.

Example:
    >>> text = "The lake (you are *):\\n*FFF\\nFHFH\\nFFFH\\nHFFG\\nYou are at row 1, column 1."
    >>> scripted_action({}, [], observations=[text])[0]["content"][0]["text"]
    '<action>right</action>'
"""

from __future__ import annotations

from collections import deque
from typing import Any

from nemo_gym_env.server.scripting import assistant_message

__all__ = ["best_move", "scripted_action"]

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def best_move(grid: list[str]) -> str:
    """The first move of a shortest path from ``*`` to ``G`` that steps on no ``H`` (``up`` when none)."""
    cells = {(r, c): ch for r, line in enumerate(grid) for c, ch in enumerate(line)}
    start = next(pos for pos, ch in cells.items() if ch == "*")
    first: dict[tuple[int, int], str | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if cells[pos] == "G":
            return first[pos] or "up"
        for name, (dr, dc) in MOVES.items():
            nxt = (pos[0] + dr, pos[1] + dc)
            if nxt in cells and nxt not in first and cells[nxt] != "H":
                first[nxt] = first[pos] or name
                queue.append(nxt)
    return "up"


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next move, from the latest observation (the lake with ``*`` where the player is)."""
    if not correct:
        return [assistant_message("<action>up</action>", f"msg_t{len(observations)}")]
    lines = (observations[-1] if observations else "").splitlines()
    grid = [line for line in lines if line and set(line) <= set("SFHG*")]
    move = best_move(grid) if grid else "up"
    return [assistant_message(f"<action>{move}</action>", f"msg_t{len(observations)}")]
