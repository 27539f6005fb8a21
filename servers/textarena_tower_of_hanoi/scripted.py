"""Scripted player for ``textarena_tower_of_hanoi``: the optimal next move from the board it is shown.

With ``correct=True`` it reads the towers from the latest ``Current Board`` and plays the next
move of the shortest solution from there (7 moves for 3 disks: reward 1). With ``correct=False``
it moves a disk from A to B and back, turn after turn (the tower never reaches C: the turn limit
ends the game with the share of disks in place, 0).

Example:
    >>> next_move({"A": [3, 2], "B": [], "C": [1]})
    'A B'
    >>> board = "Current Board: \\nA: [3, 2, 1]\\nB: []\\nC: []\\n."
    >>> scripted_action({}, [], observations=[board])[0]["content"][0]["text"]
    '[A C]'
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["next_move", "read_towers", "scripted_action"]

_TOWER = re.compile(r"^([ABC]): \[([\d, ]*)\]", re.MULTILINE)


def read_towers(text: str) -> dict[str, list[int]] | None:
    """The towers of the last board in ``text`` (bottom disk first), or None."""
    found = _TOWER.findall(text)
    if len(found) < 3:
        return None
    towers = {peg: [int(d) for d in disks.replace(",", " ").split()] for peg, disks in found[-3:]}
    return towers if set(towers) == {"A", "B", "C"} else None


def next_move(towers: dict[str, list[int]], target: str = "C") -> str | None:
    """The next move (``"A C"``) of a shortest way to stack every disk on ``target``; None when done."""
    where = {disk: peg for peg, disks in towers.items() for disk in disks}

    def solve(k: int, goal: str) -> str | None:
        if k == 0:
            return None
        if where[k] == goal:
            return solve(k - 1, goal)
        spare = ({"A", "B", "C"} - {where[k], goal}).pop()
        return solve(k - 1, spare) or f"{where[k]} {goal}"

    return solve(max(where), target) if where else None


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next move, read from the latest board."""
    towers = read_towers("\n".join(observations))
    if not correct or towers is None:
        move = "A B" if towers is None or towers["A"] and (not towers["B"] or towers["A"][-1] < towers["B"][-1]) \
            else "B A"
    else:
        move = next_move(towers) or "A C"
    return [assistant_message(f"[{move}]", f"msg_t{len(observations)}")]
