"""Deterministic scripted player for ``badge_lookup`` (tests, quickstart, benchmarks).

Not a model: it reads the row's ``names`` and ``kind``. With ``correct=True`` it looks every
name up, one call per turn, then answers from the tool's replies (reward 1.0); with
``correct=False`` it looks everyone up and then gives a wrong answer (reward 0.0). A row that
offers ``submit_answer`` (``make_dataset(answer_tool=True)``) gets the answer through that tool,
then a closing message.

Example:
    >>> row = {"kind": "single", "names": ["Ada Moreau"]}
    >>> [call] = scripted_action(row, [])
    >>> call["name"], call["arguments"]
    ('lookup_badge', '{"name": "Ada Moreau"}')
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message, field, function_call, turn_of

__all__ = ["scripted_action"]


def _badges(history: list[Any]) -> dict[str, int]:
    found = {}
    for item in history:
        try:
            reply = json.loads(field(item, "output") or "")
        except (TypeError, ValueError):
            continue
        if isinstance(reply, dict) and isinstance(reply.get("badge"), int):
            found[str(reply.get("name"))] = reply["badge"]
    return found


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True) -> list[dict[str, Any]]:
    """Next action (a list of Responses output item dicts) for the episode so far.

    Args:
        row: The dataset row being played (``kind``, ``names``).
        history: The items the environment has shown since reset (the tool replies); empty on
            the first step.
        correct: Answer right (reward 1.0) or wrong after the same lookups (0.0).
    """
    turn = turn_of(history)
    names = list(row["names"])
    if turn < len(names):
        return [function_call(turn, 0, "lookup_badge", {"name": names[turn]})]
    badges = _badges(history)
    if row["kind"] == "single":
        number = badges.get(names[0], 0)
        answer = str(number if correct else number + 1)
    else:
        ranked = sorted(names, key=lambda name: badges.get(name, 0))
        answer = ranked[-1] if correct else ranked[0]
    tools = {tool.get("name") for tool in row.get("responses_create_params", {}).get("tools") or []}
    if "submit_answer" in tools:
        if turn == len(names):
            return [function_call(turn, 0, "submit_answer", {"answer": answer})]
        return [assistant_message("I submitted the answer.", f"msg_t{turn}")]
    return [assistant_message(f"The answer is \\boxed{{{answer}}}.", f"msg_t{turn}")]
