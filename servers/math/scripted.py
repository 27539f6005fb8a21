"""Deterministic scripted player for ``math`` (tests, quickstart, benchmarks).

Not a model: it copies the row's ``expected_answer`` into ``\\boxed{}`` (``correct=True``,
reward 1.0) or boxes a different answer (``correct=False``, reward 0.0). The task is
single-turn, so every call returns one final assistant message.

Example:
    >>> row = {"expected_answer": "\\\\frac{1}{4}"}
    >>> [message] = scripted_action(row, [])
    >>> message["content"][0]["text"].splitlines()[-1]
    'The final answer is $\\\\boxed{\\\\frac{1}{4}}$.'
    >>> wrong_answer("720"), wrong_answer("-2.5"), wrong_answer("4\\\\sqrt{2}")
    ('721', '-1.5', '0')
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["scripted_action", "wrong_answer"]


def wrong_answer(expected: str) -> str:
    """A deterministic answer that differs from ``expected``: a plain number plus one, else ``0``."""
    try:
        value = Decimal(expected.strip())
    except InvalidOperation:
        value = None
    if value is not None and value.is_finite():
        return str(value + 1)
    return "0"


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """The final answer message for ``row`` (``history`` is unused: the task has one turn).

    Args:
        row: The dataset row being played (``expected_answer`` is read).
        history: Items the environment has shown since reset; ignored.
        correct: Box the expected answer (reward 1.0) or a wrong one (reward 0.0).
    """
    expected = str(row["expected_answer"])
    answer = expected if correct else wrong_answer(expected)
    text = f"Working through the problem step by step gives a single result.\nThe final answer is $\\boxed{{{answer}}}$."
    return [assistant_message(text)]
