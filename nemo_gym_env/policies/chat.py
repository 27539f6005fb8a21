"""Responses-API items <-> Chat Completions messages, as pure functions.

Chat endpoints (vLLM, OpenAI's ``/v1/chat/completions``, most local servers) speak messages;
the env speaks Responses items. The mapping:

=============================  ===================================================================
Responses                      Chat Completions
=============================  ===================================================================
``message`` system/developer   ``{"role": "system", ...}`` (``developer`` is not known to most
                               chat templates)
``message`` user               ``{"role": "user", ...}``; text parts join into one string, image
                               parts become ``image_url`` parts
model items of one turn        one ``{"role": "assistant"}``: message text as ``content``,
(``reasoning``, ``message``,   ``function_call`` items as ``tool_calls`` (``id`` = ``call_id``),
``function_call``)             reasoning as ``<think>`` text, a ``reasoning_content`` field, or
                               dropped
``function_call_output``       ``{"role": "tool", "tool_call_id": call_id, "content": output}``
``function`` tool              ``{"type": "function", "function": {name, description, ...}}``
=============================  ===================================================================

Back from an assistant message: ``reasoning_content`` (or vLLM's newer ``reasoning``) becomes a
``reasoning`` item; the text goes through :func:`~nemo_gym_env.protocol.parser.parse_model_text`, so a
server without a tool-call parser that leaves Hermes ``<tool_call>`` markup in ``content`` still
gives ``function_call`` items; ``tool_calls`` become ``function_call`` items keeping their ids.

Example:
    >>> messages = responses_to_chat_messages(
    ...     "Weather in Oslo?",
    ...     [{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
    ...      {"type": "function_call_output", "call_id": "c1", "output": "cold"}],
    ... )
    >>> [m["role"] for m in messages]
    ['user', 'assistant', 'tool']
    >>> messages[1]["tool_calls"][0]["function"]["name"], messages[2]["tool_call_id"]
    ('get_weather', 'c1')
    >>> [i["type"] for i in chat_message_to_items({"role": "assistant", "content": "It is cold."}, "t0")]
    ['message']
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from nemo_gym_env.protocol.items import content_text, is_model_item, plain, reasoning_text
from nemo_gym_env.protocol.parser import parse_model_text

__all__ = ["chat_message_to_items", "content_text", "responses_to_chat_messages", "tools_to_chat"]

ReasoningFormat = Literal["think", "field", "drop"]

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """User/system content for chat: one string, or parts when there are images."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = [plain(part) for part in content]
    if all(isinstance(p, dict) and p.get("type") in (*_TEXT_PARTS, "refusal") for p in parts):
        return content_text(parts)
    converted: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            converted.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image" and part.get("image_url"):
            image = {"url": part["image_url"]}
            if part.get("detail"):
                image["detail"] = part["detail"]
            converted.append({"type": "image_url", "image_url": image})
        else:
            raise ValueError(
                f"{where}: content part of type {kind!r} has no Chat Completions form; "
                "send text or image_url images, or use api='responses'"
            )
    return converted


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


class _Turn:
    """The model items of one turn, collected into one assistant message."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.texts: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []

    def add(self, item: dict[str, Any]) -> None:
        kind = item.get("type", "message")
        if kind == "reasoning":
            text = reasoning_text(item)
            if text:
                self.reasoning.append(text)
        elif kind == "function_call":
            self.tool_calls.append(
                {
                    "id": item.get("call_id") or item.get("id") or f"call_{len(self.tool_calls)}",
                    "type": "function",
                    "function": {"name": item["name"], "arguments": _arguments(item.get("arguments"))},
                }
            )
        else:
            text = content_text(item.get("content"))
            if text:
                self.texts.append(text)

    def message(self, reasoning: ReasoningFormat) -> dict[str, Any]:
        text = "\n\n".join(self.texts)
        thoughts = "\n\n".join(self.reasoning)
        if thoughts and reasoning == "think":
            text = f"<think>\n{thoughts}\n</think>\n\n{text}" if text else f"<think>\n{thoughts}\n</think>"
        message: dict[str, Any] = {"role": "assistant", "content": text or (None if self.tool_calls else "")}
        if thoughts and reasoning == "field":
            message["reasoning_content"] = thoughts
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def responses_to_chat_messages(
    input: str | Sequence[Any],
    history: Iterable[Any] = (),
    *,
    instructions: str | None = None,
    reasoning: ReasoningFormat = "think",
) -> list[dict[str, Any]]:
    """Chat Completions ``messages`` for a task's input items and an episode's history.

    Args:
        input: The task input: a string (one user message) or Responses input items.
        history: The episode's items so far: model output items and ``function_call_output``
            items, in order. Token-id fields on them are ignored.
        instructions: Responses ``instructions``; becomes a leading system message.
        reasoning: How earlier ``reasoning`` items travel: ``"think"`` (``<think>...</think>``
            before the assistant text, as a model writes it), ``"field"`` (vLLM's
            ``reasoning_content`` message field) or ``"drop"``.

    Returns:
        Messages in order; consecutive model items form one assistant message.

    Raises:
        ValueError: An item the Chat Completions API cannot express (e.g. a file part or an
            unknown item type), naming its position.
        TypeError: An item that is not a dict or pydantic model.

    Example:
        >>> responses_to_chat_messages([{"role": "developer", "content": "Be brief."}], [])
        [{'role': 'system', 'content': 'Be brief.'}]
    """
    if reasoning not in ("think", "field", "drop"):
        raise ValueError(f"reasoning must be 'think', 'field' or 'drop', got {reasoning!r}")
    items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
    items.extend(history)
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    turn: _Turn | None = None
    for position, raw in enumerate(items):
        item = plain(raw)
        if not isinstance(item, dict):
            raise TypeError(f"item {position} is a {type(item).__name__}, not a Responses item")
        if is_model_item(item):
            turn = turn or _Turn()
            turn.add(item)
            continue
        if turn is not None:
            messages.append(turn.message(reasoning))
            turn = None
        kind = item.get("type", "message")
        where = f"item {position}"
        if kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": output if isinstance(output, str) else content_text(output),
                }
            )
        elif kind == "message" and item.get("role") in ("system", "developer", "user"):
            role = "user" if item["role"] == "user" else "system"
            messages.append({"role": role, "content": _user_content(item.get("content"), where)})
        else:
            raise ValueError(f"{where} has type {kind!r} (role {item.get('role')!r}), which chat messages cannot express")
    if turn is not None:
        messages.append(turn.message(reasoning))
    return messages


def chat_message_to_items(message: Any, id_prefix: str) -> list[dict[str, Any]]:
    """Responses output items for one Chat Completions assistant message.

    Args:
        message: ``choices[i].message`` as a dict or an ``openai`` SDK object.
        id_prefix: Makes item ids ``rs_<prefix>_0``, ``msg_<prefix>_1``, ``fc_<prefix>_2``
            (the number is the item's position); use one prefix per model call. Tool calls
            keep the server's ``id`` as ``call_id`` (``call_<prefix>_<n>`` when it has none).

    Returns:
        At most one ``reasoning`` item (the ``reasoning_content``/``reasoning`` field, then any
        ``<think>`` text), at most one assistant ``message``, then the ``function_call`` items:
        those written as Hermes markup in the text first, then the structured ``tool_calls``.

    Example:
        >>> items = chat_message_to_items(
        ...     {"role": "assistant", "content": None, "reasoning_content": "Look it up.",
        ...      "tool_calls": [{"id": "call_9", "type": "function",
        ...                      "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        ...     "t1")
        >>> [(i["type"], i["id"]) for i in items]
        [('reasoning', 'rs_t1_0'), ('function_call', 'fc_t1_1')]
        >>> items[1]["call_id"]
        'call_9'
    """
    message = plain(message)
    if not isinstance(message, dict):
        raise TypeError(f"a chat message must be an object, got {type(message).__name__}")
    field = message.get("reasoning_content") or message.get("reasoning")
    parsed = parse_model_text(content_text(message.get("content")), id_prefix=id_prefix)
    refusal = message.get("refusal")

    thoughts = [field.strip()] if isinstance(field, str) and field.strip() else []
    thoughts += [reasoning_text(i) for i in parsed if i["type"] == "reasoning"]
    items: list[dict[str, Any]] = []
    if any(thoughts):
        items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": "\n\n".join(t for t in thoughts if t)}]})
    items += [i for i in parsed if i["type"] == "message"]
    if isinstance(refusal, str) and refusal and not any(i["type"] == "message" for i in items):
        items.append(
            {"type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "refusal", "refusal": refusal}]}
        )
    items += [i for i in parsed if i["type"] == "function_call"]
    structured_from = len(items)
    for call in message.get("tool_calls") or []:
        call = plain(call)
        function = call.get("function") or {}
        if not isinstance(function.get("name"), str):
            raise ValueError(f"tool call {call.get('id')!r} has no function name")
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id") or "",
                "name": function["name"],
                "arguments": _arguments(function.get("arguments")),
                "status": "completed",
            }
        )
    kinds = {"reasoning": "rs", "message": "msg", "function_call": "fc"}
    for position, item in enumerate(items):
        item["id"] = f"{kinds[item['type']]}_{id_prefix}_{position}"
        parsed_call = item["type"] == "function_call" and position < structured_from
        if parsed_call or (item["type"] == "function_call" and not item["call_id"]):
            item["call_id"] = f"call_{id_prefix}_{position}"
    return items


def tools_to_chat(tools: Iterable[Any] | None) -> list[dict[str, Any]]:
    """Chat Completions ``tools`` for Responses ``function`` tools (chat-shaped ones pass through).

    Raises:
        ValueError: A built-in tool (``web_search``, ``file_search``...) that chat endpoints lack.

    Example:
        >>> tools_to_chat([{"type": "function", "name": "add", "parameters": {"type": "object"}}])
        [{'type': 'function', 'function': {'name': 'add', 'parameters': {'type': 'object'}}}]
    """
    converted: list[dict[str, Any]] = []
    for position, raw in enumerate(tools or []):
        tool = plain(raw)
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise ValueError(
                f"tool {position} has type {kind!r}: Chat Completions endpoints take only function tools; "
                "use api='responses' for built-in tools"
            )
        if isinstance(tool.get("function"), dict):
            converted.append({"type": "function", "function": dict(tool["function"])})
            continue
        if not isinstance(tool.get("name"), str):
            raise ValueError(f"tool {position} is a function tool without a 'name'")
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if tool.get(key) is not None}
        converted.append({"type": "function", "function": function})
    return converted
