"""Parse raw model text into Responses-API output items, and render items back to text.

This is the single place where chat-template markup becomes structured items:

* ``<think>...</think>`` blocks (Qwen3/DeepSeek style) become one ``reasoning`` item;
* Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks become
  ``function_call`` items;
* whatever is left becomes one assistant ``message`` item.

Rules, in the order the scanner applies them:

1. If the text contains ``</think>`` and no ``<think>`` comes before it (Qwen3 templates put the
   opening tag in the prompt), everything before that ``</think>`` is reasoning.
2. The rest is scanned left to right for the earliest tag:

   * ``<think>`` opens a reasoning block that runs to the next ``</think>``, or to the end of
     the text when there is none (generation cut off while thinking);
   * a stray ``</think>`` is dropped;
   * ``<tool_call>`` is matched with the next ``</tool_call>``. A body that is a JSON object with
     a string ``name`` becomes a call; any other body stays visible text, tags included, so the
     model sees its own malformed output. A ``<tool_call>`` with no closing tag after it
     (generation cut off) keeps everything from it to the end as text.

Scanning uses ``str.find`` with cached positions, so it is linear in the length of the text.

Example:
    >>> items = parse_model_text(
    ...     '<think>Add them.</think>Calling.<tool_call>{"name": "add", "arguments": {"a": 1}}'
    ...     "</tool_call>",
    ...     id_prefix="t",
    ... )
    >>> [item["type"] for item in items]
    ['reasoning', 'message', 'function_call']
    >>> items[2]["arguments"]
    '{"a": 1}'
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from nemo_gym_env.protocol.items import content_text, item_kind, plain, reasoning_text

__all__ = ["items_to_text", "parse_model_text", "render_tool_call", "tool_call_problem"]

THINK_OPEN = "<think>"
"""Opens a reasoning block."""
THINK_CLOSE = "</think>"
"""Closes a reasoning block (alone, it ends reasoning begun in the prompt, as in Qwen3)."""
TOOL_OPEN = "<tool_call>"
"""Opens a Hermes/Qwen tool call."""
TOOL_CLOSE = "</tool_call>"
"""Closes a Hermes/Qwen tool call."""

_TAGS = (THINK_OPEN, THINK_CLOSE, TOOL_OPEN, TOOL_CLOSE)
_MAX_TAG = max(len(tag) for tag in _TAGS)
_EMPTY_THINK = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


class _Finder:
    """``str.find`` with a per-needle cache, so repeated lookups from a moving cursor stay linear."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._next: dict[str, int] = {}

    def find(self, needle: str, start: int) -> int:
        """Position of the first ``needle`` at or after ``start``, or -1."""
        cached = self._next.get(needle)
        if cached is None or (cached != -1 and cached < start):
            cached = self._text.find(needle, start)
            self._next[needle] = cached
        return cached


class _Visible:
    """The visible text being assembled, guarding the junctions where markup was removed.

    Removing a think block or a tool call joins the text on both sides; if that junction would
    spell one of the tags (``"<tool_" + "call>"``), a space is inserted so that reparsing the
    message text gives the same items.
    """

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._tail = ""

    def append(self, piece: str) -> None:
        """Add ``piece`` after the text so far."""
        if not piece:
            return
        if self._tail and self._forges_tag(self._tail, piece[: _MAX_TAG - 1]):
            self._pieces.append(" ")
            self._tail += " "
        self._pieces.append(piece)
        self._tail = (self._tail + piece[-(_MAX_TAG - 1) :])[-(_MAX_TAG - 1) :]

    @staticmethod
    def _forges_tag(left: str, right: str) -> bool:
        window = left + right
        boundary = len(left)
        for tag in _TAGS:
            start = window.find(tag)
            while start != -1:
                if start < boundary < start + len(tag):
                    return True
                start = window.find(tag, start + 1)
        return False

    def text(self) -> str:
        """The assembled text, stripped."""
        return "".join(self._pieces).strip()


def _parse_call_body(body: str) -> tuple[str, str] | None:
    """``(name, arguments_json)`` for a well-formed tool-call body, else ``None``."""
    try:
        payload = json.loads(body.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    if "arguments" in payload:
        arguments = payload["arguments"]
    else:
        arguments = payload.get("parameters")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        return payload["name"], arguments
    try:
        return payload["name"], json.dumps(arguments, ensure_ascii=False)
    except (ValueError, RecursionError):  # pragma: no cover - json.loads output always dumps
        return None


def tool_call_problem(text: str) -> str | None:
    """Why the first ``<tool_call>`` in ``text`` is not a tool call; None when the text has none.

    Meant for the visible text :func:`parse_model_text` leaves (a message item's), where every
    well-formed call has already become a ``function_call`` item, so a ``<tool_call>`` left
    there is a malformed one.

    Example:
        >>> tool_call_problem('<tool_call>{city: 1}</tool_call>')
        'the <tool_call> body is not JSON (Expecting property name enclosed in double quotes at column 2): {city: 1}'
        >>> tool_call_problem("It is sunny.") is None
        True
    """
    start = text.find(TOOL_OPEN)
    if start == -1:
        return None
    body_start = start + len(TOOL_OPEN)
    close = text.find(TOOL_CLOSE, body_start)
    body = text[body_start:] if close == -1 else text[body_start:close]
    shown = body.strip()[:200]
    if close == -1:
        return f"a <tool_call> without its </tool_call> (cut off by the turn's token limit?): {shown}"
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return f"the <tool_call> body is not JSON ({exc.msg} at column {exc.colno}): {shown}"
    except (ValueError, RecursionError) as exc:
        return f"the <tool_call> body is not readable JSON ({type(exc).__name__}): {shown}"
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return f'the <tool_call> body is not a JSON object with a string "name": {shown}'
    return None


def _make_id(kind: str, id_prefix: str | None, index: int) -> str:
    if id_prefix is None:
        return f"{kind}_{uuid.uuid4().hex}"
    return f"{kind}_{id_prefix}_{index}"


def parse_model_text(text: str, *, id_prefix: str | None = None) -> list[dict]:
    """Turn raw model output into Responses-API output items.

    Never raises for a ``str`` input: malformed tool calls stay visible text.

    Args:
        text: The decoded generation, chat-template markup included.
        id_prefix: When given, ids are deterministic (``rs_<prefix>_0``, ``msg_<prefix>_1``,
            ``fc_<prefix>_2`` with ``call_<prefix>_2``; the number is the item's position);
            otherwise they are random ``uuid4`` hex.

    Returns:
        Plain JSON-able dicts in this order: at most one ``reasoning`` item (all think blocks
        joined by blank lines), at most one assistant ``message`` (the remaining visible text,
        stripped, when non-empty), then the ``function_call`` items in order of appearance.

    Example:
        >>> parse_model_text("Hello", id_prefix="x")[0]["content"][0]["text"]
        'Hello'
    """
    finder = _Finder(text)
    reasoning: list[str] = []
    visible = _Visible()
    calls: list[tuple[str, str]] = []
    pos = 0
    end = len(text)

    first_close = finder.find(THINK_CLOSE, 0)
    if first_close != -1:
        first_open = finder.find(THINK_OPEN, 0)
        if first_open == -1 or first_open > first_close:
            reasoning.append(text[:first_close])
            pos = first_close + len(THINK_CLOSE)

    while pos < end:
        candidates = [
            (found, tag)
            for tag in (THINK_OPEN, THINK_CLOSE, TOOL_OPEN)
            if (found := finder.find(tag, pos)) != -1
        ]
        if not candidates:
            visible.append(text[pos:])
            break
        found, tag = min(candidates)
        visible.append(text[pos:found])
        if tag == THINK_OPEN:
            body_start = found + len(THINK_OPEN)
            close = finder.find(THINK_CLOSE, body_start)
            if close == -1:
                reasoning.append(text[body_start:])
                break
            reasoning.append(text[body_start:close])
            pos = close + len(THINK_CLOSE)
        elif tag == THINK_CLOSE:
            pos = found + len(THINK_CLOSE)
        else:
            body_start = found + len(TOOL_OPEN)
            close = finder.find(TOOL_CLOSE, body_start)
            if close == -1:
                visible.append(text[found:])
                break
            pos = close + len(TOOL_CLOSE)
            parsed = _parse_call_body(text[body_start:close])
            if parsed is None:
                visible.append(text[found:pos])
            else:
                calls.append(parsed)

    items: list[dict] = []
    reasoning_text = "\n\n".join(part for part in (p.strip() for p in reasoning) if part)
    if reasoning_text:
        items.append(
            {
                "type": "reasoning",
                "id": _make_id("rs", id_prefix, len(items)),
                "summary": [{"type": "summary_text", "text": reasoning_text}],
            }
        )
    message_text = visible.text()
    if message_text:
        items.append(
            {
                "type": "message",
                "id": _make_id("msg", id_prefix, len(items)),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message_text, "annotations": []}],
            }
        )
    for name, arguments in calls:
        index = len(items)
        items.append(
            {
                "type": "function_call",
                "id": _make_id("fc", id_prefix, index),
                "call_id": _make_id("call", id_prefix, index),
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
        )
    return items


def render_tool_call(name: str, arguments: dict | str) -> str:
    """Render one Hermes/Qwen tool call, the inverse of the parser's tool-call rule.

    Think and tool-call tags inside the JSON strings are written with a ``\\u003c`` escape, so
    the block always ends at its own closing tag and never reads as reasoning markup.

    Args:
        name: The function name.
        arguments: The arguments object, or a string kept verbatim as the ``arguments`` value
            (the parser then returns that exact string).

    Returns:
        ``'<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>'``.

    Example:
        >>> render_tool_call("add", {"a": 1})
        '<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n</tool_call>'
    """
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    for tag in _TAGS:
        body = body.replace(tag, "\\u003c" + tag[1:])
    return f"{TOOL_OPEN}\n{body}\n{TOOL_CLOSE}"


def _call_arguments(arguments: Any) -> dict | str:
    """Render canonical JSON objects as objects (natural model text), anything else verbatim."""
    if not isinstance(arguments, str):
        return arguments if isinstance(arguments, dict) else json.dumps(arguments, ensure_ascii=False)
    try:
        loaded = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    if isinstance(loaded, dict) and json.dumps(loaded, ensure_ascii=False) == arguments:
        return loaded
    return arguments


def items_to_text(items: list[dict]) -> str:
    """Render reasoning, message and function-call items as the raw text a model would emit.

    The inverse of :func:`parse_model_text`: for items it produced,
    ``parse_model_text(items_to_text(items))`` gives the same items up to ids.

    Args:
        items: ``reasoning``, ``message`` and ``function_call`` dicts (or pydantic models); a
            dict with ``role`` and ``content`` but no ``type`` counts as a message.

    Returns:
        ``'<think>\\n...\\n</think>\\n\\n'`` (when there is reasoning), then the message text, then
        one rendered tool call per line.

    Raises:
        ValueError: An item of another type (e.g. ``function_call_output``).

    Example:
        >>> items_to_text([{"type": "message", "role": "assistant", "content": "Hi"}])
        'Hi'
    """
    reasoning: list[str] = []
    texts: list[str] = []
    calls: list[str] = []
    for raw in items:
        item = plain(raw)
        if not isinstance(item, dict):
            raise TypeError(f"expected an item dict, got {type(item).__name__}")
        kind = item_kind(item)
        if kind == "reasoning":
            text = reasoning_text(item)
            if text:
                reasoning.append(text)
        elif kind == "message":
            text = content_text(item.get("content")).strip()
            if text:
                texts.append(text)
        elif kind == "function_call":
            calls.append(render_tool_call(item["name"], _call_arguments(item.get("arguments", "{}"))))
        else:
            raise ValueError(f"items_to_text cannot render an item of type {kind!r}")

    text = "\n\n".join(texts)
    # A leftover unterminated <tool_call> must stay last, or it would swallow the calls after it.
    unterminated = text.rfind(TOOL_OPEN) > text.rfind(TOOL_CLOSE)
    body_parts = [*calls, text] if unterminated else [text, *calls]
    body = "\n".join(part for part in body_parts if part)
    if reasoning:
        think = f"{THINK_OPEN}\n" + "\n\n".join(reasoning) + f"\n{THINK_CLOSE}"
        return f"{think}\n\n{body}" if body else think
    if THINK_CLOSE in body:
        # Without an opening tag, a </think> would turn everything before it into reasoning.
        return _EMPTY_THINK + body
    return body
