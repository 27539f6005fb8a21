"""Deterministic scripted player for ``example_single_tool_call`` (tests, quickstart, benchmarks).

Not a model: it reads the city out of the last user message with a fixed rule. With
``correct=True`` it calls ``get_weather`` once and then answers (reward 1.0); with
``correct=False`` it answers at once without calling the tool (reward 0.0).

Example:
    >>> row = {"responses_create_params": {"input": [{"role": "user", "content": "Snow in Oslo?"}]}}
    >>> [call] = scripted_action(row, [])
    >>> call["name"], call["arguments"]
    ('get_weather', '{"city": "Oslo"}')
"""

from __future__ import annotations

import json
import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message, field, function_call, turn_of

__all__ = ["city_of", "scripted_action"]

_CAPITALISED = re.compile(r"[A-Z][\w'\-]*(?:\s+[A-Z][\w'\-]*)*")
DEFAULT_CITY = "Springfield"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return " ".join(str(field(part, "text") or "") for part in parts)


def city_of(row: dict[str, Any]) -> str:
    """The city named in the row's last user message: its last run of capitalised words.

    A run at the very start of the message (a sentence's first word) and a lone ``I`` are
    skipped; :data:`DEFAULT_CITY` when nothing is left.
    """
    messages = row["responses_create_params"]["input"]
    if isinstance(messages, str):
        text = messages
    else:
        users = [m for m in messages if field(m, "role") == "user"]
        text = _text(field(users[-1], "content")) if users else ""
    names = [m.group(0) for m in _CAPITALISED.finditer(text) if m.start() > 0 and m.group(0) != "I"]
    return names[-1] if names else DEFAULT_CITY


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """Next action (a list of Responses output item dicts) for the episode so far.

    Args:
        row: The dataset row being played.
        history: The items the environment has shown since reset (``function_call_output``
            items of earlier steps, in order); empty on the first step.
        correct: Play for reward 1.0 (call the tool) or for 0.0 (answer without calling it).
    """
    turn = turn_of(history)
    city = city_of(row)
    if turn == 0:
        if not correct:
            return [
                assistant_message(f"I cannot look up the weather in {city}; check a forecast before you go.",
                                  f"msg_t{turn}")
            ]
        return [function_call(0, 0, "get_weather", {"city": city})]
    description = f"I could not read the weather for {city}."
    for item in reversed(history):
        try:
            reply = json.loads(field(item, "output") or "")
        except (TypeError, ValueError):
            continue
        if isinstance(reply, dict) and isinstance(reply.get("weather_description"), str):
            description = reply["weather_description"]
            break
    return [assistant_message(f"{description} Dress for it.", f"msg_t{turn}")]
