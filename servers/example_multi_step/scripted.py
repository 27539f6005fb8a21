"""Deterministic scripted player for ``example_multi_step`` (tests, quickstart, benchmarks).

Not a model: it reads the row's ``expected_synonyms``. Turn 0 calls ``get_synonym_value``
once per expected synonym (several calls in one turn); turn 1 calls
``extract_synonym_values`` with the values read from those outputs, in order
(``correct=True``, reward 1.0) or reversed / perturbed (``correct=False``, reward 0.0);
turn 2 answers with a final message.

Example:
    >>> row = {"expected_synonyms": ["Wee", "Tiny"]}
    >>> [c["arguments"] for c in scripted_action(row, [])]
    ['{"synonym": "Wee"}', '{"synonym": "Tiny"}']
    >>> outputs = [
    ...     {"type": "function_call_output", "call_id": "call_t0_0", "output": '{"synonym_value": 290}'},
    ...     {"type": "function_call_output", "call_id": "call_t0_1", "output": '{"synonym_value": 412}'},
    ... ]
    >>> scripted_action(row, outputs)[0]["arguments"]
    '{"synonym_values": [290, 412]}'
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym_env.protocol.scripting import CALL_ID, assistant_message, field, function_call, turn_of

__all__ = ["scripted_action", "wrong_values"]



def _looked_up_values(history: list[Any], count: int) -> list[int]:
    """Values from the turn-0 ``get_synonym_value`` outputs, in call order (0 where unreadable)."""
    values = [0] * count
    for item in history:
        match = CALL_ID.match(str(field(item, "call_id") or ""))
        if not match or match.group(1) != "0" or int(match.group(2)) >= count:
            continue
        try:
            reply = json.loads(field(item, "output") or "")
            values[int(match.group(2))] = int(reply["synonym_value"])
        except (TypeError, ValueError, KeyError):
            pass
    return values


def wrong_values(values: list[int]) -> list[int]:
    """A deterministic wrong answer: the values reversed, or with the first one off by one."""
    wrong = list(reversed(values))
    if wrong == values:
        wrong = [values[0] + 1, *values[1:]] if values else [0]
    return wrong


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """Next action (a list of Responses output item dicts) for the episode so far.

    Args:
        row: The dataset row being played (``expected_synonyms`` is read).
        history: The items the environment has shown since reset (``function_call_output``
            items of earlier steps, in order); empty on the first step.
        correct: Play for reward 1.0, or submit wrong values for 0.0.
    """
    synonyms = list(row["expected_synonyms"])
    turn = turn_of(history)
    if turn == 0 and synonyms:
        return [function_call(0, i, "get_synonym_value", {"synonym": s}) for i, s in enumerate(synonyms)]
    if turn <= 1:
        values = _looked_up_values(history, len(synonyms))
        submitted = values if correct else wrong_values(values)
        return [function_call(turn, 0, "extract_synonym_values", {"synonym_values": submitted})]
    return [assistant_message(f"I looked up {len(synonyms)} synonym values and submitted them.", f"msg_t{turn}")]
