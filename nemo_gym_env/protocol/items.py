"""Responses-API items as plain data: what kind an item is, its text, and the one check of a model turn.

Every part of the package that looks at items (the env, the parser, the spaces, the policies,
the trainer adapters) asks here, so the rules cannot drift apart:

- :func:`plain` turns an ``openai`` SDK or pydantic object into the JSON dict it stands for;
- :func:`item_kind` says what an item is (an item without ``type`` but with a ``role`` is a
  message, the Responses API's ``EasyInputMessage``);
- :func:`is_model_item` says whether the model wrote it;
- :func:`content_text` and :func:`reasoning_text` read the text out of content and summary parts;
- :func:`check_turn` validates a model turn's items against the wire types;
- :func:`without_token_fields` takes the training token fields off an item.

Example:
    >>> item_kind({"role": "user", "content": "hi"}), is_model_item({"type": "function_call"})
    ('message', True)
    >>> content_text([{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}])
    'ab'
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from nemo_gym_env.protocol.keys import TOKEN_FIELDS
from nemo_gym_env.protocol.types import (
    FunctionCall,
    FunctionCallForTraining,
    OutputMessage,
    OutputMessageForTraining,
    ReasoningItem,
    ReasoningItemForTraining,
    make_response,
)

__all__ = [
    "ACTION_ITEM_TYPES",
    "ITEM_TYPES",
    "MODEL_ITEM_TYPES",
    "check_turn",
    "content_text",
    "final_answer",
    "is_model_item",
    "item_kind",
    "plain",
    "reasoning_text",
    "without_token_fields",
]

ITEM_TYPES: tuple[str, ...] = ("message", "function_call", "function_call_output", "reasoning")
"""Item types an episode holds (and an observation may hold)."""

ACTION_ITEM_TYPES: tuple[str, ...] = ("message", "function_call", "reasoning")
"""Item types a model may emit in a turn (tool outputs come from the environment)."""

MODEL_ITEM_TYPES: tuple[str, ...] = ("function_call", "reasoning")
"""Item types only a model writes; an assistant ``message`` is the model's too."""


def plain(value: Any) -> Any:
    """``value`` as JSON data: an ``openai`` SDK or pydantic object dumped, anything else unchanged.

    Dumped in JSON mode, by alias, without ``None`` fields: the form items travel in.

    Example:
        >>> from nemo_gym_env.protocol.types import FunctionCallOutput
        >>> plain(FunctionCallOutput(call_id="c1", output="ok"))
        {'call_id': 'c1', 'output': 'ok', 'type': 'function_call_output'}
    """
    if not isinstance(value, (dict, list, str)) and hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True, by_alias=True)
    return value


def without_token_fields(item: Any) -> Any:
    """``item`` as plain data without the training fields of :data:`~nemo_gym_env.protocol.keys.TOKEN_FIELDS`.

    An item without them comes back as it is (after :func:`plain`), not copied.

    Example:
        >>> without_token_fields({"type": "message", "content": "a", "prompt_token_ids": [1]})
        {'type': 'message', 'content': 'a'}
    """
    item = plain(item)
    if isinstance(item, dict) and any(k in item for k in TOKEN_FIELDS):
        return {k: v for k, v in item.items() if k not in TOKEN_FIELDS}
    return item


def item_kind(item: Any) -> str | None:
    """An item dict's ``type``; ``"message"`` for a ``role`` dict without one; None otherwise."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return kind if isinstance(kind, str) else None


def is_model_item(item: Any) -> bool:
    """Whether the model wrote ``item``: a ``function_call``, ``reasoning`` or assistant ``message``."""
    kind = item_kind(item)
    return kind in MODEL_ITEM_TYPES or (kind == "message" and item.get("role") == "assistant")


def content_text(content: Any) -> str:
    """The text of a message ``content``: a string, or its text and refusal parts joined.

    Example:
        >>> content_text("plain"), content_text([{"type": "refusal", "refusal": "no"}])
        ('plain', 'no')
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        part = plain(part)
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict):
            text = part.get("text", part.get("refusal"))
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


def final_answer(items: list[Any]) -> str:
    """The text of the last assistant message among ``items`` ("" when there is none).

    Example:
        >>> final_answer([{"role": "assistant", "content": "Paris"}, {"type": "function_call"}])
        'Paris'
    """
    for item in reversed(items):
        item = plain(item)
        if item_kind(item) == "message" and item.get("role") == "assistant":
            return content_text(item.get("content"))
    return ""


def reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its summary parts (else its content parts), stripped, one per paragraph."""
    parts = item.get("summary") or item.get("content") or []
    texts = [content_text([part]).strip() for part in parts]
    return "\n\n".join(text for text in texts if text)


_MODELS: dict[str, tuple[type[BaseModel], type[BaseModel]]] = {
    "message": (OutputMessage, OutputMessageForTraining),
    "function_call": (FunctionCall, FunctionCallForTraining),
    "reasoning": (ReasoningItem, ReasoningItemForTraining),
}


def check_turn(items: list[dict[str, Any]]) -> str | None:
    """Why ``items`` are not a valid model turn (``"<position>.<field>: <reason>"``), or None.

    The items are validated against the wire types (:mod:`nemo_gym_env.protocol.types`), as the
    env's ``step`` and the action space's ``contains`` both require. A turn the ``Response``
    model accepts is valid; when it does not, the reason given is the one of the item's own
    model (a ``function_call`` without ``name`` is said to lack ``name``, not a token field of
    the training variant that the union tried first).
    """
    try:
        make_response(items)
        return None
    except ValidationError:
        pass
    except RecursionError:
        return "nested too deeply"
    for position, item in enumerate(items):
        models = _MODELS.get(str(item_kind(item)))
        if models is None:
            continue
        model = models[1] if any(name in item for name in TOKEN_FIELDS) else models[0]
        try:
            model.model_validate(item)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in (position, *first["loc"]))
            return f"{where}: {first['msg']}"
        except RecursionError:
            return f"{position}: nested too deeply"
    return "the items do not form a valid Responses output"
