"""Deterministic scripted player for ``reasoning_gym`` (tests, quickstart, benchmarks).

Not a model: it rebuilds the row's reasoning-gym entry (as the verifier does) and answers in
one message, ``<answer>{answer}</answer>``: the entry's own answer (``correct=True``, reward
1.0 wherever the library's oracle answer scores 1.0) or a different one (``correct=False``).

Example:
    >>> wrong_answer("41"), wrong_answer("True"), wrong_answer("Paris")
    ('42', 'False', '∅')
    >>> row = {"task_name": "leg_counting", "task_seed": 0, "task_size": 1, "task_index": 0, "task_config": {}}
    >>> scripted_action(row, [])[0]["content"][0]["text"]
    '<answer>500</answer>'
"""

from __future__ import annotations

import functools
import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message
from nemo_gym_env.servers.reasoning_gym import tasks

__all__ = ["correct_answer", "scripted_action", "wrong_answer"]

_INTEGER = re.compile(r"-?\d+")
_FLIPS = {
    "True": "False",
    "False": "True",
    "true": "false",
    "false": "true",
    "Yes": "No",
    "No": "Yes",
    "yes": "no",
    "no": "yes",
}
_NON_ANSWER = "∅"


def wrong_answer(answer: str) -> str:
    """A deterministic answer different from ``answer`` that does not contain it.

    An integer plus one, a yes/no or true/false flipped, otherwise ``"∅"`` (``"0"`` if the
    answer is ``"∅"``). The library's default scorer gives partial credit to an answer that
    contains the right one, hence "does not contain".
    """
    if _INTEGER.fullmatch(answer):
        return str(int(answer) + 1)
    if answer in _FLIPS:
        return _FLIPS[answer]
    return _NON_ANSWER if answer != _NON_ANSWER else "0"


@functools.lru_cache(maxsize=4096)
def _answer(key: tasks.TaskKey) -> str:
    answer = tasks.regenerate(key)["answer"]
    return "" if answer is None else str(answer)


def correct_answer(row: dict[str, Any]) -> str:
    """The regenerated entry's answer (``""`` for the few tasks that have no single oracle answer).

    A NeMo Gym row (no ``task_name``; it carries ``answer``) gives its own ``answer``.
    """
    if row.get("task_name") is None:
        return "" if row.get("answer") is None else str(row["answer"])
    return _answer(tasks.TaskKey.from_row(row))


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """The one-message answer to ``row`` (a list with one Responses output message).

    Args:
        row: The dataset row (its ``task_*`` fields are read).
        history: Ignored: the task is answered in one turn.
        correct: Answer with the entry's answer (reward 1.0) or :func:`wrong_answer` of it (0.0).
    """
    answer = correct_answer(row)
    text = f"<answer>{answer if correct else wrong_answer(answer)}</answer>"
    return [assistant_message(text)]
