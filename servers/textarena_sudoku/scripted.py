"""Scripted player for ``textarena_sudoku``: solves the grid it is shown and fills one cell a turn.

With ``correct=True`` it reads the latest ``Game Board``, solves it (backtracking) and answers the
first empty cell's digit, ``[row column digit]`` (every move valid: reward 1 at the end). With
``correct=False`` it answers a digit that breaks the rules (TextArena's invalid-move notice, then
the game ends).

Example:
    >>> grid = [[0] * 9 for _ in range(9)]
    >>> solve(grid) and all(sorted(row) == list(range(1, 10)) for row in grid)
    True
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["read_grid", "scripted_action", "solve"]

_ROW = re.compile(r"^R(\d)\s+(.*)$", re.MULTILINE)


def read_grid(text: str) -> list[list[int]] | None:
    """The last 9x9 grid in ``text`` (0 for an empty cell), or None."""
    rows = _ROW.findall(text)
    if len(rows) < 9:
        return None
    grid = []
    for _, cells in rows[-9:]:
        values = [0 if c == "." else int(c) for c in cells.replace("|", " ").split()]
        if len(values) != 9:
            return None
        grid.append(values)
    return grid


def _fits(grid: list[list[int]], r: int, c: int, digit: int) -> bool:
    if digit in grid[r] or any(grid[i][c] == digit for i in range(9)):
        return False
    br, bc = 3 * (r // 3), 3 * (c // 3)
    return all(grid[i][j] != digit for i in range(br, br + 3) for j in range(bc, bc + 3))


def solve(grid: list[list[int]]) -> bool:
    """Fill ``grid`` in place; False when it has no solution."""
    for r in range(9):
        for c in range(9):
            if grid[r][c] == 0:
                for digit in range(1, 10):
                    if _fits(grid, r, c, digit):
                        grid[r][c] = digit
                        if solve(grid):
                            return True
                        grid[r][c] = 0
                return False
    return True


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next cell, read from the latest board."""
    grid = read_grid("\n".join(observations))
    turn = f"msg_t{len(observations)}"
    if grid is None:
        return [assistant_message("[1 1 1]", turn)]
    empty = [(r, c) for r in range(9) for c in range(9) if grid[r][c] == 0]
    if not empty:
        return [assistant_message("[1 1 1]", turn)]
    r, c = empty[0]
    if not correct:  # a digit already in the row: against the rules
        digit = next(d for d in grid[r] if d)
        return [assistant_message(f"[{r + 1} {c + 1} {digit}]", turn)]
    solved = [line[:] for line in grid]
    solve(solved)
    return [assistant_message(f"[{r + 1} {c + 1} {solved[r][c]}]", turn)]
