"""Actions: what a model turn may be, and its one normalisation into Responses items."""

from __future__ import annotations

import json
from typing import Any

from nemo_gym_env.errors import ActionError
from nemo_gym_env.protocol.items import ACTION_ITEM_TYPES, check_turn, item_kind, plain
from nemo_gym_env.protocol.parser import parse_model_text

__all__ = ["ActionError", "normalize_action"]


def normalize_action(action: Any, *, turn: int) -> list[dict[str, Any]]:
    """Turn an action into validated Responses output item dicts with ids filled in.

    Accepts raw model text, a list of items (dicts, pydantic or ``openai`` SDK objects), or a
    whole ``Response`` (dict or object). Ids missing from items are made deterministic from
    the turn number, so equal seeds and actions give equal observations.
    """
    action = plain(action)
    if isinstance(action, str):
        return _on_the_wire(parse_model_text(action, id_prefix=f"t{turn}"))
    if isinstance(action, dict) and action.get("object") == "response" and isinstance(action.get("output"), list):
        action = action["output"]
    if not isinstance(action, (list, tuple)):
        raise ActionError(
            f"an action is raw model text, a list of Responses output items, or a Response; "
            f"got {type(action).__name__}"
        )
    items: list[dict[str, Any]] = []
    for position, raw in enumerate(action):
        item = plain(raw)
        if not isinstance(item, dict):
            raise ActionError(f"action item {position} is a {type(item).__name__}, not a Responses item dict")
        item = dict(item)
        kind = item_kind(item)
        if kind not in ACTION_ITEM_TYPES:
            raise ActionError(
                f"action item {position} has type {item.get('type')!r}; a model turn holds "
                f"{sorted(ACTION_ITEM_TYPES)} items (tool outputs come from the environment)"
            )
        item["type"] = kind
        if kind == "message":
            item.setdefault("role", "assistant")
            if item["role"] != "assistant":
                raise ActionError(f"action item {position} is a {item['role']!r} message; the model speaks as 'assistant'")
            if isinstance(item.get("content"), str):
                item["content"] = [{"type": "output_text", "text": item["content"], "annotations": []}]
            item.setdefault("status", "completed")
            item.setdefault("id", f"msg_t{turn}_{position}")
        elif kind == "function_call":
            if isinstance(item.get("arguments"), (dict, list)):
                try:
                    item["arguments"] = json.dumps(item["arguments"], ensure_ascii=False, allow_nan=False)
                except (TypeError, ValueError, RecursionError) as exc:
                    raise ActionError(f"action item {position}: arguments are not JSON: {exc}") from None
            item.setdefault("call_id", f"call_t{turn}_{position}")
            item.setdefault("id", f"fc_t{turn}_{position}")
        else:
            item.setdefault("id", f"rs_t{turn}_{position}")
        items.append(item)
    problem = check_turn(items)
    if problem is not None:
        raise ActionError(f"invalid action item: {problem}")
    return _on_the_wire(items)


def _on_the_wire(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items``, once sure they travel as JSON text: pydantic accepts what UTF-8 JSON cannot
    carry (bytes for text, NaN, lone surrogates), and the items go to servers as such."""
    try:
        json.dumps(items, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise ActionError(f"invalid action: not JSON text: {exc}"[:500]) from None
    return items
