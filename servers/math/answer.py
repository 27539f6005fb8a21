"""Find a model's final answer: the last assistant message, and the last ``\\boxed{...}`` in it.

Pure functions with linear cost, safe to call on the event loop for bounded text::

    >>> last_boxed(r"First \\boxed{1}, then \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> extract_answer("So the total is 1,250 apples.", fallback="last_number")
    '1250'

Only the last assistant message counts: reasoning items and earlier messages are ignored,
so an answer that appears only in a reasoning item scores nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, Literal

__all__ = [
    "AnswerFallback",
    "answer_after_colon",
    "boxed_spans",
    "extract_answer",
    "last_assistant_text",
    "last_boxed",
    "last_number",
]

AnswerFallback = Literal["last_number", "answer_colon", "none"]

# `\boxed{`, `\boxed {`, `\fbox{`: the brace that opens the content is the last char of the match.
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A brace preceded by an even number of backslashes (`\{` is a literal brace, `\\{` is not).
_BRACE = re.compile(r"(?<!\\)(?:\\\\)*([{}])")
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\w])")
_ANSWER_COLON = re.compile(r"answer\s*[:：]", re.IGNORECASE)
_WRAPPERS = "*_`$ \t"


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or ():
        if _field(part, "type") in ("output_text", "input_text", "text"):
            parts.append(_field(part, "text") or "")
    return "".join(parts)


def last_assistant_text(output: Iterable[Any], max_chars: int) -> tuple[str | None, bool]:
    """Text of the last assistant message in ``output``, capped to its last ``max_chars`` characters.

    Returns:
        ``(text, truncated)``; ``text`` is ``None`` when there is no assistant message.
        Refusal parts and non-message items (reasoning, tool calls) are ignored.
    """
    for item in reversed(list(output)):
        if _field(item, "type") == "message" and _field(item, "role") == "assistant":
            text = _message_text(_field(item, "content"))
            if len(text) > max_chars:
                return text[-max_chars:], True
            return text, False
    return None, False


def _matching_braces(text: str) -> dict[int, int]:
    """Position of each unescaped ``{`` -> position of the ``}`` that closes it (one pass)."""
    closes: dict[int, int] = {}
    stack: list[int] = []
    for match in _BRACE.finditer(text):
        position = match.start(1)
        if match.group(1) == "{":
            stack.append(position)
        elif stack:
            closes[stack.pop()] = position
    return closes


def boxed_spans(text: str) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of the content of every complete ``\\boxed{...}`` / ``\\fbox{...}``, in order.

    Braces nest (``\\boxed{\\frac{1}{2}}``); ``\\{`` and ``\\}`` are literal. A box whose
    braces never close (a cut-off answer) is skipped.
    """
    openings = list(_BOX_OPEN.finditer(text))
    closes = _matching_braces(text) if openings else {}
    for match in openings:
        opening = match.end() - 1
        if opening in closes:
            yield opening + 1, closes[opening]


def last_boxed(text: str) -> str | None:
    """Content of the last complete box: the one that closes last (outermost when nested)."""
    best: tuple[int, int] | None = None
    for start, end in boxed_spans(text):
        if best is None or end > best[1]:
            best = (start, end)
    if best is None:
        return None
    content = text[best[0] : best[1]].strip()
    while (opened := _BOX_OPEN.match(content)) and _matching_braces(content).get(opened.end() - 1) == len(
        content
    ) - 1:
        content = content[opened.end() : -1].strip()  # \boxed{\boxed{5}} -> 5
    return content


def last_number(text: str) -> str | None:
    """The last number in ``text`` (``-3``, ``2.5``, ``1,250`` -> ``1250``, ``3/4``), or ``None``."""
    found = None
    for found in _NUMBER.finditer(text):
        pass
    return found.group(0).replace(",", "") if found else None


def answer_after_colon(text: str) -> str | None:
    """What follows the last ``Answer:`` (any case) on its line, without markdown or ``$`` wrappers."""
    found = None
    for found in _ANSWER_COLON.finditer(text):
        pass
    if found is None:
        return None
    line = text[found.end() :].split("\n", 1)[0].strip(_WRAPPERS)
    line = line.rstrip(".").strip(_WRAPPERS)
    return line or None


def extract_answer(text: str, fallback: AnswerFallback = "none") -> str | None:
    """The final answer in ``text``: the last box, else the ``fallback`` rule, else ``None``."""
    boxed = last_boxed(text)
    if boxed:  # an empty box is no answer
        return boxed
    if fallback == "last_number":
        return last_number(text)
    if fallback == "answer_colon":
        return answer_after_colon(text)
    return None
