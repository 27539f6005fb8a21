"""The other side of a two-player TextArena game: a scripted player of ours, or a model behind a policy.

An opponent is ``opponent(observation, env) -> move`` (or an awaitable of it): ``observation`` is
what the game told the opponent's player since its last move, as text; ``env`` the TextArena env,
which a scripted opponent may read (its ``state.game_state``). It returns the move as TextArena
reads it (``[4]``).

Example:
    >>> board = [["X", "", ""], ["", "O", ""], ["", "", ""]]
    >>> tic_tac_toe_move(board, "X")
    '[2]'
"""

from __future__ import annotations

from typing import Any

__all__ = ["BUILTIN_OPPONENTS", "PolicyOpponent", "tic_tac_toe_move"]

_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
_PREFERENCE = (4, 0, 2, 6, 8, 1, 3, 5, 7)


def tic_tac_toe_move(board: list[list[str]], mark: str) -> str:
    """A sound Tic Tac Toe move for ``mark`` on ``board`` (rows of ``"X"``, ``"O"`` or ``""``).

    Wins when it can, else blocks the other side's win, else takes the centre, a corner, an edge.
    """
    cells = [board[r][c] for r in range(3) for c in range(3)]
    other = "O" if mark == "X" else "X"
    for who in (mark, other):
        for line in _LINES:
            marks = [cells[i] for i in line]
            if marks.count(who) == 2 and marks.count("") == 1:
                return f"[{line[marks.index('')]}]"
    free = next(i for i in _PREFERENCE if cells[i] == "")
    return f"[{free}]"


def _tic_tac_toe(observation: str, env: Any) -> str:
    state = env.state
    mark = "X" if state.current_player_id == 1 else "O"  # TextArena's TicTacToe: player 1 is X
    return tic_tac_toe_move(state.game_state["board"], mark)


BUILTIN_OPPONENTS = {"TicTacToe": _tic_tac_toe}
"""Game name (the id before ``-v0``) -> our scripted opponent for it."""


class PolicyOpponent:
    """A policy of ours (the local model, an OpenAI-compatible endpoint) as the opponent.

    It keeps one conversation per game: the game's messages as user turns, its moves as assistant
    turns; the move is the text of its turn. Built on first use, so a server that never plays a
    two-player game loads no model.
    """

    def __init__(self, policy_kwargs: dict[str, Any]):
        self.policy_kwargs = dict(policy_kwargs)
        self._policy: Any = None
        self._conversations: dict[int, list[dict[str, Any]]] = {}

    async def __call__(self, observation: str, env: Any) -> str:
        from nemo_gym_env.policies.base import PolicyRequest
        from nemo_gym_env.policies.factory import make_policy

        if self._policy is None:
            kwargs = dict(self.policy_kwargs)
            self._policy = make_policy(kwargs.pop("kind", "local"), **kwargs)
        history = self._conversations.setdefault(id(env.state), [])
        history.append({"type": "message", "role": "user", "content": observation})
        turn = await self._policy.generate(PolicyRequest(input=list(history), history=[]))
        text = turn.said()
        history.append({"type": "message", "role": "assistant", "content": text})
        if len(self._conversations) > 1024:  # games that ended: their states are gone
            self._conversations.pop(next(iter(self._conversations)))
        return text
