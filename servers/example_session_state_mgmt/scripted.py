"""Deterministic scripted player for ``example_session_state_mgmt`` (tests, quickstart, benchmarks).

Not a model: it reads ``initial_count`` and ``expected_count`` from the row. Turn 0 makes
the increments (the integers in the user's message when they add up to
``expected_count - initial_count``, else one increment of that difference), several calls
in one turn; with ``correct=False`` the last increment is one too large, so the counter
ends off by one (reward 0.0). Turn 1 calls ``get_counter_value``; turn 2 answers with the
count it read.

Example:
    >>> row = {"responses_create_params": {"input": [{"role": "user", "content": "add 4 then 5"}]},
    ...        "initial_count": 1, "expected_count": 10}
    >>> [c["arguments"] for c in scripted_action(row, [])]
    ['{"count": 4}', '{"count": 5}']
    >>> [c["arguments"] for c in scripted_action(row, [], correct=False)]
    ['{"count": 4}', '{"count": 6}']
"""

from __future__ import annotations

import json
import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message, field, function_call, turn_of

__all__ = ["increments", "scripted_action"]

_INTEGER = re.compile(r"-?\d+")


def _user_text(row: dict[str, Any]) -> str:
    messages = row["responses_create_params"]["input"]
    if isinstance(messages, str):
        return messages
    texts = []
    for message in messages:
        if field(message, "role") != "user":
            continue
        content = field(message, "content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(str(field(part, "text") or "") for part in content)
    return " ".join(texts)


def increments(row: dict[str, Any], *, correct: bool = True) -> list[int]:
    """The increments the player makes, in order.

    They bring ``initial_count`` to ``expected_count`` (``correct=True``) or one past it.
    """
    delta = int(row["expected_count"]) - int(row["initial_count"])
    steps = [int(x) for x in _INTEGER.findall(_user_text(row))]
    if not steps or sum(steps) != delta:
        steps = [delta]
    if not correct:
        steps[-1] += 1
    return steps


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """Next action (a list of Responses output item dicts) for the episode so far.

    Args:
        row: The dataset row being played (``initial_count``, ``expected_count`` and the user
            message are read).
        history: The items the environment has shown since reset (``function_call_output``
            items of earlier steps, in order); empty on the first step.
        correct: Play for reward 1.0, or end the counter off by one for 0.0.
    """
    turn = turn_of(history)
    if turn == 0:
        return [
            function_call(0, i, "increment_counter", {"count": n})
            for i, n in enumerate(increments(row, correct=correct))
        ]
    if turn == 1:
        return [function_call(1, 0, "get_counter_value", {})]
    count = "unknown"
    for item in reversed(history):
        try:
            reply = json.loads(field(item, "output") or "")
        except (TypeError, ValueError):
            continue
        if isinstance(reply, dict) and isinstance(reply.get("count"), int):
            count = str(reply["count"])
            break
    return [assistant_message(f"The counter now reads {count}.", f"msg_t{turn}")]
