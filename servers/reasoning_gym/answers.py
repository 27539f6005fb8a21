"""Where the model's answer is: the last assistant message, then ``<answer>``, ``\\boxed{}`` or the whole text.

Example:
    >>> extract_answer("Sum first. <answer>7</answer> no, <answer> 8 </answer>", "boxed")
    ('8', 'answer_tag')
    >>> extract_answer(r"so \\boxed{\\frac{1}{2}}", "boxed")
    ('\\\\frac{1}{2}', 'boxed')
    >>> extract_answer("just 8", "none")
    (None, None)
    >>> extract_answer("  just 8 ", "full_text")
    ('just 8', 'full_text')

Every step is a linear scan (``str.rfind`` and one bounded brace walk), so a huge output
costs time proportional to its length, never more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal, get_args

__all__ = [
    "FALLBACKS",
    "AnswerFallback",
    "AnswerSource",
    "answer_tag",
    "boxed",
    "extract_answer",
    "final_text",
]

AnswerFallback = Literal["none", "boxed", "full_text"]
"""What to try when there is no ``<answer>`` tag: nothing, ``\\boxed{}``, or ``\\boxed{}`` then the whole text."""

AnswerSource = Literal["answer_tag", "boxed", "full_text"]
"""Which rule found the answer (reported as the ``answer_source`` metric)."""

FALLBACKS: tuple[str, ...] = get_args(AnswerFallback)

_OPEN, _CLOSE = "<answer>", "</answer>"
_BOXED = "\\boxed{"
# Bounds on the work adversarial text can cause: \boxed{ occurrences tried from the end, and
# how far past each one its closing brace may be.
_BOXED_TRIES = 8
_BOXED_WINDOW = 65_536
_BRACE = re.compile(r"[{}]")


def _field(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def final_text(output: Sequence[Any]) -> str | None:
    """Text of the last assistant ``message`` in ``output`` (its ``output_text`` parts joined), or None.

    Reasoning items, tool calls and tool outputs are never read: an answer that only appears
    in the model's reasoning does not count.
    """
    for item in reversed(output):
        if _field(item, "type") == "message" and _field(item, "role") == "assistant":
            content = _field(item, "content")
            if isinstance(content, str):
                return content
            return "".join(
                str(_field(part, "text") or "")
                for part in content or []
                if _field(part, "type") == "output_text"
            )
    return None


def answer_tag(text: str) -> str | None:
    """Content of the last complete ``<answer>...</answer>`` pair, stripped; None without one."""
    close = text.rfind(_CLOSE)
    if close < 0:
        return None
    start = text.rfind(_OPEN, 0, close)
    if start < 0:
        return None
    return text[start + len(_OPEN) : close].strip()


def boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, stripped; None without one.

    An opening whose brace does not close within 64 KiB counts as unbalanced; then the
    occurrence before it is tried (8 at most).
    """
    end = len(text)
    for _ in range(_BOXED_TRIES):
        start = text.rfind(_BOXED, 0, end)
        if start < 0:
            return None
        body = start + len(_BOXED)
        depth = 1
        for match in _BRACE.finditer(text, body, min(len(text), body + _BOXED_WINDOW)):
            depth += 1 if match.group() == "{" else -1
            if depth == 0:
                return text[body : match.start()].strip()
        end = start  # unbalanced: try the one before
    return None


def extract_answer(
    text: str | None, fallback: AnswerFallback = "boxed"
) -> tuple[str | None, AnswerSource | None]:
    """The answer in ``text`` and the rule that found it; ``(None, None)`` when there is none.

    Order: the last ``<answer>`` tag; then, if ``fallback`` is ``"boxed"`` or ``"full_text"``,
    the last ``\\boxed{}``; then, if it is ``"full_text"``, the whole stripped text (when not
    empty).
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"answer fallback must be one of {FALLBACKS}, got {fallback!r}")
    if text is None:
        return None, None
    found = answer_tag(text)
    if found is not None:
        return found, "answer_tag"
    if fallback in ("boxed", "full_text"):
        found = boxed(text)
        if found is not None:
            return found, "boxed"
    if fallback == "full_text" and text.strip():
        return text.strip(), "full_text"
    return None, None
