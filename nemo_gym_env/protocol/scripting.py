"""Building blocks of scripted players: deterministic stand-ins for a model, as every bundled
server ships (``servers/<name>/scripted.py``: tests, the quickstart, benchmarks).

A player is ``scripted_action(row, history, correct=True) -> list of Responses output items``,
where ``history`` holds what the env returned since reset (tool outputs, the server's
messages). A player of a hosted env (the bridge's servers) also takes ``observations=``: the
text of every user message so far, the latest last; :func:`play_turn` gives each player what it
asks for. Call ids are ``call_t<turn>_<index>``, so a player can tell from the tool outputs
which turn it is on.

Example:
    >>> function_call(0, 1, "get_weather", {"city": "Lima"})["call_id"]
    'call_t0_1'
    >>> turn_of([{"type": "function_call_output", "call_id": "call_t0_1", "output": "{}"}])
    1
    >>> assistant_message("Done.")["content"][0]["text"]
    'Done.'
    >>> reasoning("Add them up.")["summary"][0]["text"]
    'Add them up.'
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from nemo_gym_env.protocol.items import content_text

__all__ = ["CALL_ID", "assistant_message", "field", "function_call", "play_turn", "reasoning", "turn_of"]

CALL_ID = re.compile(r"^call_t(\d+)_(\d+)$")
"""A scripted call id: group 1 the turn, group 2 the call's index in that turn."""


def field(item: Any, key: str) -> Any:
    """``item[key]`` for a dict, ``item.key`` for an SDK object; None when missing."""
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def turn_of(history: list[Any]) -> int:
    """The turn about to be played: one past the latest turn whose tool outputs are in ``history``."""
    turns = [int(m.group(1)) for item in history if (m := CALL_ID.match(str(field(item, "call_id") or "")))]
    return max(turns) + 1 if turns else 0


def function_call(turn: int, index: int, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """A ``function_call`` item with id ``call_t<turn>_<index>``; a str ``arguments`` is sent as is."""
    return {
        "type": "function_call",
        "call_id": f"call_t{turn}_{index}",
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        "id": f"fc_t{turn}_{index}",
    }


def assistant_message(text: str, item_id: str = "msg_t0") -> dict[str, Any]:
    """A completed assistant ``message`` item holding ``text``."""
    return {
        "type": "message",
        "role": "assistant",
        "id": item_id,
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def reasoning(text: str, item_id: str = "rs_t0") -> dict[str, Any]:
    """A ``reasoning`` item whose one summary part holds ``text`` (as a ``<think>`` block becomes)."""
    return {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}]}


def play_turn(player: Callable[..., list[dict[str, Any]]], row: dict[str, Any], shown: Iterable[Any],
              history: Iterable[Any], *, correct: bool = True) -> list[dict[str, Any]]:
    """The player's next turn: ``history`` is what the env returned since reset (tool outputs
    and the server's messages; the player's own items are left out); a player whose signature
    has an ``observations`` parameter also gets the text of every user message, those the
    reset ``shown`` first.

    Example:
        >>> def echo(row, history, *, correct=True, observations=()):
        ...     return [assistant_message(observations[-1])]
        >>> said = {"type": "message", "role": "user", "content": "Go."}
        >>> play_turn(echo, {}, [said], [])[0]["content"][0]["text"]
        'Go.'
    """
    returned = [item for item in history if field(item, "type") == "function_call_output" or _from_user(item)]
    try:
        observes = _takes_observations(player)
    except TypeError:  # a player object that cannot be hashed: asked afresh
        observes = _takes_observations.__wrapped__(player)
    if not observes:
        return player(row, returned, correct=correct)
    said = [content_text(field(item, "content")) for item in [*shown, *returned] if _from_user(item)]
    return player(row, returned, correct=correct, observations=said)


@functools.lru_cache(maxsize=256)
def _takes_observations(player: Callable[..., Any]) -> bool:
    """Whether a player's signature has ``observations`` (asked at every turn: read once per player)."""
    return "observations" in inspect.signature(player).parameters


def _from_user(item: Any) -> bool:
    return (field(item, "type") or "message") == "message" and field(item, "role") == "user"
