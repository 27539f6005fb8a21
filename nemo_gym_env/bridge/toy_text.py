"""Gymnasium's toy-text envs in words: action names, the rules as a prompt states them, and their state as text.

``render_mode="ansi"`` would do for some (FrozenLake, CliffWalking, Taxi draw a grid), but their
grids carry terminal colour codes, Taxi's does not say where the passenger is in words, and
Blackjack has no text rendering at all. A model reads these instead. Each formatter is
``formatter(env, observation, info) -> str`` (``env`` unwrapped), the signature a user's
formatter has too (:mod:`nemo_gym_env.bridge.gymnasium_env`).

Example:
    >>> import gymnasium as gym
    >>> env = gym.make("CliffWalking-v1")
    >>> obs, info = env.reset(seed=0)
    >>> print(describe(env.unwrapped, obs, info).splitlines()[-1])
    You are at row 4, column 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TOY_TEXT", "ToyText", "describe", "toy_text_of"]


@dataclass(frozen=True)
class ToyText:
    """What the bridge knows of one toy-text env class."""

    action_names: tuple[str, ...]
    rules: str
    """The game, its rewards and its end, for the prompt."""


TOY_TEXT: dict[str, ToyText] = {
    "FrozenLakeEnv": ToyText(
        ("left", "down", "right", "up"),
        "You cross a frozen lake on a grid, from the start S to the goal G, without falling into a hole H "
        "(F is frozen ice you can stand on). When the ice is slippery you may slide to a side of the direction "
        "you chose. Reaching G gives a reward of 1 and ends the game; falling into a hole ends it with 0."),
    "TaxiEnv": ToyText(
        ("south", "north", "east", "west", "pickup", "dropoff"),
        "You drive a taxi on a 5x5 grid with walls (|). Drive to the passenger, pick them up, drive to their "
        "destination and drop them off. Every step costs -1, delivering the passenger gives +20, and a pickup "
        "or dropoff in the wrong place costs -10. North is up, south is down."),
    "BlackjackEnv": ToyText(
        ("stick", "hit"),
        "You play one hand of blackjack against the dealer. Face cards count 10 and an ace 1 or 11. Hit to "
        "draw a card; stick to stop, and the dealer then draws until reaching 17 or more. Ending closer to 21 "
        "than the dealer wins +1, going over 21 or ending lower loses -1, a tie is 0."),
    "CliffWalkingEnv": ToyText(
        ("up", "right", "down", "left"),
        "You walk on a 4x12 grid from the start S (bottom left) to the goal G (bottom right). The cells "
        "between them on the bottom row are a cliff C. Every step costs -1; stepping onto the cliff costs -100 "
        "and sends you back to the start. Reaching G ends the game."),
}
"""The toy-text env classes the bridge describes, by class name."""


def toy_text_of(env: Any) -> ToyText | None:
    """The :class:`ToyText` of an env class or an (unwrapped) env, or None when it is none of them."""
    return TOY_TEXT.get((env if isinstance(env, type) else type(env)).__name__)


def _grid(rows: list[str], here: tuple[int, int], mark: str = "*") -> str:
    r, c = here
    lines = [list(row) for row in rows]
    lines[r][c] = mark
    return "\n".join("".join(line) for line in lines)


def _frozen_lake(env: Any, observation: Any, info: dict) -> str:
    ncol = int(env.ncol)
    row, col = divmod(int(observation), ncol)
    rows = ["".join(c.decode() for c in line) for line in env.desc.tolist()]
    return (f"The lake (you are *):\n{_grid(rows, (row, col))}\n"
            f"You are at row {row + 1}, column {col + 1}.")


_TAXI_PLACES = ("R", "G", "Y", "B")


def _taxi(env: Any, observation: Any, info: dict) -> str:
    taxi_row, taxi_col, passenger, destination = env.decode(int(observation))
    rows = ["".join(c.decode() for c in line) for line in env.desc.tolist()]
    grid = _grid(rows, (1 + taxi_row, 2 * taxi_col + 1), "T")

    def place(index: int) -> str:
        r, c = env.locs[index]
        return f"{_TAXI_PLACES[index]} (row {r + 1}, column {c + 1})"

    where = "in the taxi" if passenger == 4 else f"waiting at {place(passenger)}"
    return (f"The map (T is the taxi):\n{grid}\nThe taxi is at row {taxi_row + 1}, column {taxi_col + 1}. "
            f"The passenger is {where}. The destination is {place(destination)}.")


def _blackjack(env: Any, observation: Any, info: dict) -> str:
    total, dealer, usable_ace = (int(x) for x in observation)
    ace = " (counting an ace as 11)" if usable_ace else ""
    shown = "an ace" if dealer == 1 else str(dealer)
    return f"Your cards total {total}{ace}. The dealer shows {shown}."


def _cliff_walking(env: Any, observation: Any, info: dict) -> str:
    nrow, ncol = (int(n) for n in env.shape)
    row, col = divmod(int(observation), ncol)
    rows = ["." * ncol for _ in range(nrow)]
    rows[-1] = "S" + "C" * (ncol - 2) + "G"
    return (f"The grid (you are *):\n{_grid(rows, (row, col))}\n"
            f"You are at row {row + 1}, column {col + 1}.")


_FORMATTERS = {"FrozenLakeEnv": _frozen_lake, "TaxiEnv": _taxi, "BlackjackEnv": _blackjack,
               "CliffWalkingEnv": _cliff_walking}


def describe(env: Any, observation: Any, info: dict) -> str:
    """The state of a toy-text env in words (``KeyError`` for another env)."""
    return _FORMATTERS[type(env).__name__](env, observation, info)
