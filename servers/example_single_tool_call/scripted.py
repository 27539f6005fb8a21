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

__all__ = ["city_of", "scripted_action"]

_CALL_ID = re.compile(r"^call_t(\d+)_\d+$")
_CAPITALISED = re.compile(r"[A-Z][\w'\-]*(?:\s+[A-Z][\w'\-]*)*")
DEFAULT_CITY = "Springfield"


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def _turn(history: list[Any]) -> int:
    """The turn about to be played: one past the latest turn whose tool outputs are in ``history``."""
    turns = [int(m.group(1)) for item in history if (m := _CALL_ID.match(str(_field(item, "call_id") or "")))]
    return max(turns) + 1 if turns else 0


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return " ".join(str(_field(part, "text") or "") for part in parts)


def city_of(row: dict[str, Any]) -> str:
    """The city named in the row's last user message: its last run of capitalised words.

    A run at the very start of the message (a sentence's first word) and a lone ``I`` are
    skipped; :data:`DEFAULT_CITY` when nothing is left.
    """
    messages = row["responses_create_params"]["input"]
    if isinstance(messages, str):
        text = messages
    else:
        users = [m for m in messages if _field(m, "role") == "user"]
        text = _text(_field(users[-1], "content")) if users else ""
    names = [m.group(0) for m in _CAPITALISED.finditer(text) if m.start() > 0 and m.group(0) != "I"]
    return names[-1] if names else DEFAULT_CITY


def _message(turn: int, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_t{turn}",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


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
    turn = _turn(history)
    city = city_of(row)
    if turn == 0:
        if not correct:
            return [
                _message(turn, f"I cannot look up the weather in {city}; check a forecast before you go.")
            ]
        arguments = json.dumps({"city": city})
        return [
            {
                "type": "function_call",
                "call_id": "call_t0_0",
                "name": "get_weather",
                "arguments": arguments,
                "id": "fc_t0_0",
            }
        ]
    description = f"I could not read the weather for {city}."
    for item in reversed(history):
        try:
            reply = json.loads(_field(item, "output") or "")
        except (TypeError, ValueError):
            continue
        if isinstance(reply, dict) and isinstance(reply.get("weather_description"), str):
            description = reply["weather_description"]
            break
    return [_message(turn, f"{description} Dress for it.")]
