"""Deterministic scripted player for ``mcqa`` (tests, quickstart, benchmarks).

Not a model: it reads the row's ``expected_answer`` and ends its single message with
``Answer: \\boxed{X}``, a line every grading mode accepts (one box holding one letter, an
``Answer:`` line) and that the example rows' ``output_regex`` matches. With ``correct=False``
X is another option's letter (reward 0.0).

Example:
    >>> row = {"options": [{"A": "Venus"}, {"B": "Mercury"}], "expected_answer": "B"}
    >>> scripted_action(row, [])[0]["content"][0]["text"].splitlines()[-1]
    'Answer: \\\\boxed{B}'
    >>> wrong_letter(row)
    'A'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["scripted_action", "wrong_letter"]


def _letters(options: Any) -> list[str]:
    pairs = (
        options.items() if isinstance(options, Mapping) else [kv for entry in options for kv in entry.items()]
    )
    return sorted(str(key).strip().upper() for key, text in pairs if text is not None)


def wrong_letter(row: dict[str, Any]) -> str:
    """The first option letter that is not ``expected_answer``."""
    expected = str(row["expected_answer"]).strip().upper()
    others = [letter for letter in _letters(row["options"]) if letter != expected]
    if not others:
        raise ValueError("a row with a single option has no wrong answer")
    return others[0]


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """The final answer message for ``row`` (``history`` is unused: the task has one turn).

    Args:
        row: The dataset row being played (``options`` and ``expected_answer`` are read).
        history: Items the environment has shown since reset; ignored.
        correct: Choose the expected letter (reward 1.0) or another option (reward 0.0).
    """
    letter = str(row["expected_answer"]).strip().upper() if correct else wrong_letter(row)
    text = f"I compared each option with what I know and kept one.\nAnswer: \\boxed{{{letter}}}"
    return [assistant_message(text)]
