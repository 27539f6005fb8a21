"""Scripted player for ``frozen_lake``: reads the lake from the observation and plays the best move there.

With ``correct=True`` it plays the optimal policy of the lake it is shown, computed by value
iteration with the slippery ice's rule (the move chosen, or either side of it, a third each): on
the 4x4 lake it reaches the goal about three times in four. With ``correct=False`` it always goes
``up``. Not a model: tests, benchmarks and the no-model demo.

Example:
    >>> text = "The lake (you are *):\\n*FFF\\nFHFH\\nFFFH\\nHFFG\\nYou are at row 1, column 1."
    >>> scripted_action({}, [], observations=[text])[0]["content"][0]["text"]
    '<action>left</action>'
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["best_move", "scripted_action"]

MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_ORDER = list(MOVES)


def best_move(grid: list[str], *, slippery: bool = True) -> str:
    """The move from ``*`` that reaches ``G`` most often (value iteration; holes ``H`` end the game)."""
    here = next((r, line.index("*")) for r, line in enumerate(grid) if "*" in line)
    lake = tuple(line.replace("*", "F") for line in grid)
    return _policy(lake, slippery)[here]


@lru_cache(maxsize=64)
def _policy(grid: tuple[str, ...], slippery: bool, sweeps: int = 200) -> dict[tuple[int, int], str]:
    rows, cols = len(grid), len(grid[0])
    cells = {(r, c): grid[r][c] for r in range(rows) for c in range(cols)}

    def land(pos: tuple[int, int], move: str) -> tuple[int, int]:
        dr, dc = MOVES[move]
        r, c = min(max(pos[0] + dr, 0), rows - 1), min(max(pos[1] + dc, 0), cols - 1)
        return r, c

    def outcomes(pos: tuple[int, int], move: str) -> list[tuple[int, int]]:
        i = _ORDER.index(move)
        chosen = [_ORDER[(i - 1) % 4], move, _ORDER[(i + 1) % 4]] if slippery else [move]
        return [land(pos, m) for m in chosen]

    value = {pos: 1.0 if ch == "G" else 0.0 for pos, ch in cells.items()}
    for _ in range(sweeps):
        for pos, ch in cells.items():
            if ch not in "GH":
                value[pos] = max(sum(value[p] for p in outcomes(pos, m)) / len(outcomes(pos, m)) for m in _ORDER)
    return {pos: max(_ORDER, key=lambda m: sum(value[p] for p in outcomes(pos, m))) for pos in cells}


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next move, from the latest observation (the lake with ``*`` where the player is)."""
    turn = f"msg_t{len(observations)}"
    if not correct:
        return [assistant_message("<action>up</action>", turn)]
    lines = (observations[-1] if observations else "").splitlines()
    grid = [line for line in lines if line and set(line) <= set("SFHG*")]
    move = best_move(grid) if grid else "up"
    return [assistant_message(f"<action>{move}</action>", turn)]
