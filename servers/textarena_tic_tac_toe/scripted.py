"""Scripted player for ``textarena_tic_tac_toe``: the side the model plays (O, player 0), played soundly.

With ``correct=True`` it reads the latest board and plays as the opponent does (win, block,
centre, corner, edge), so games against the scripted opponent end in a draw (reward 0). With
``correct=False`` it plays the free cells in order, 8 down to 0 (it loses: reward -1).

Example:
    >>> board = "Current Board:\\n\\n O | 1 | 2 \\n---+---+---\\n 3 | X | 5 \\n---+---+---\\n 6 | 7 | 8 \\n"
    >>> read_board(board)
    [['O', '', ''], ['', 'X', ''], ['', '', '']]
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym_env.bridge.opponents import tic_tac_toe_move
from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["read_board", "scripted_action"]

_BOARD = re.compile(r"Current Board:\s*\n\s*\n(.*?)\n\s*\n", re.DOTALL)


def read_board(text: str) -> list[list[str]] | None:
    """The last board in ``text`` as rows of ``"X"``, ``"O"`` or ``""``, or None."""
    found = _BOARD.findall(text + "\n\n")
    if not found:
        return None
    rows = [line for line in found[-1].splitlines() if "|" in line]
    board = [[cell.strip() if cell.strip() in ("X", "O") else "" for cell in line.split("|")] for line in rows]
    return board if len(board) == 3 and all(len(line) == 3 for line in board) else None


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """The next mark, from the latest board."""
    board = read_board("\n".join(observations))
    turn = f"msg_t{len(observations)}"
    if board is None:
        return [assistant_message("[4]", turn)]
    if correct:
        return [assistant_message(tic_tac_toe_move(board, "O"), turn)]
    free = [i for i in range(8, -1, -1) if board[i // 3][i % 3] == ""]
    return [assistant_message(f"[{free[0]}]", turn)]
