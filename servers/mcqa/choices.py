"""Read the chosen option letter out of a model's answer, one function per grading mode.

All functions take the (already capped) text of the last assistant message and the row's
options as a letter -> text mapping, and return an uppercase letter or ``None``::

    >>> options = {"A": "Venus", "B": "Mercury", "C": "Mars"}
    >>> strict_boxed_letter(r"It orbits fastest, so \\boxed{B}.", options)
    'B'
    >>> lenient_boxed_letter(r"\\boxed{\\text{(b) Mercury}}", options)
    'B'
    >>> answer_colon_letter("Reasoning...\\n**Answer:** Mercury", options)
    'B'

The built-in patterns run in linear time and are safe on the event loop. A row's own
``output_regex`` is not: :func:`last_captures` is meant to run in a worker process.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

from nemo_gym_env.servers.math.answer import boxed_spans

__all__ = [
    "answer_colon_letter",
    "captured_letter",
    "last_captures",
    "lenient_boxed_letter",
    "option_letters",
    "strict_boxed_letter",
]

_LETTER_KEY = re.compile(r"[A-Za-z]")
# A letter that stands alone: "B", "(B)", "[b]", "B.", "B) Paris", "B: Paris", "B - Paris"; not "A large".
_LEADING_LETTER = re.compile(r"[(\[]?\s*([A-Za-z])\s*(?:[)\].:,;]|$|\s[-–—:(])")
# Decoration allowed around the letter in strict mode: no other letters at all.
_STRICT_CONTENT = re.compile(r"[^A-Za-z]*([A-Z])[^A-Za-z]*")
# A wrapper spanning the whole string: \text{...}, \textbf{...}, \mathrm{...}, \boxed{...}, ...
_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|boxed|fbox)\s*\{(.*)\}", re.DOTALL)
_ANSWER_COLON = re.compile(r"\banswer[*_\s]*[:：]", re.IGNORECASE)
_DECORATION = "*_`$ \t"
MAX_CHOICE_CHARS = 2000
"""Longer boxes or ``Answer:`` lines are not read as a choice (bounds the work per candidate)."""


def option_letters(options: Sequence[Mapping[str, str | None]] | Mapping[str, str | None]) -> dict[str, str]:
    """The options as uppercase letter -> text; entries whose text is ``None`` are left out.

    Accepts NeMo Gym's list of one-key dicts (``[{"A": "..."}, {"B": "..."}]``) or one dict.

    Raises:
        ValueError: A key is not a single letter, or a letter appears twice.
    """
    pairs = (
        options.items() if isinstance(options, Mapping) else [kv for entry in options for kv in entry.items()]
    )
    letters: dict[str, str] = {}
    for key, text in pairs:
        if not (isinstance(key, str) and _LETTER_KEY.fullmatch(key.strip())):
            raise ValueError(f"option key {key!r} is not a single letter")
        letter = key.strip().upper()
        if letter in letters:
            raise ValueError(f"option {letter} appears twice")
        if text is not None:
            letters[letter] = text
    return letters


def _normalize(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def _unwrap(text: str) -> str:
    """Strip markdown, ``$`` and whole-string LaTeX wrappers: ``**$\\text{B}$**`` -> ``B``."""
    text = text.strip(_DECORATION)
    for _ in range(4):
        match = _WRAPPER.fullmatch(text)
        if match is None:
            break
        text = match.group(1).strip(_DECORATION)
    return text


def captured_letter(text: str, options: Mapping[str, str]) -> str | None:
    """The option ``text`` names: a standalone leading letter, or an option's exact text."""
    if len(text) > MAX_CHOICE_CHARS:
        return None
    text = _unwrap(text)
    match = _LEADING_LETTER.match(text)
    if match and match.group(1).upper() in options:
        return match.group(1).upper()
    wanted = _normalize(text)
    named = [letter for letter, option in options.items() if _normalize(option) == wanted]
    return named[0] if len(named) == 1 else None


def strict_boxed_letter(text: str, options: Mapping[str, str]) -> str | None:
    """``strict_single_letter_boxed``: exactly one box, holding one uppercase option letter.

    Non-letter decoration inside the box is allowed (``\\boxed{(C)}``); two boxes, a
    lowercase letter, or any other word in the box give ``None``.
    """
    spans = list(boxed_spans(text))
    if len(spans) != 1 or spans[0][1] - spans[0][0] > MAX_CHOICE_CHARS:
        return None
    match = _STRICT_CONTENT.fullmatch(text[spans[0][0] : spans[0][1]])
    return match.group(1) if match and match.group(1) in options else None


def lenient_boxed_letter(text: str, options: Mapping[str, str]) -> str | None:
    """``lenient_boxed``: the last box that names an option (by letter, also ``\\text{B}``, or by text)."""
    for start, end in reversed(list(boxed_spans(text))):
        if end - start > MAX_CHOICE_CHARS:
            continue
        letter = captured_letter(text[start:end], options)
        if letter is not None:
            return letter
    return None


def answer_colon_letter(text: str, options: Mapping[str, str]) -> str | None:
    """``lenient_answer_colon``: what the last ``Answer:`` (any case) names, on the rest of its line."""
    found = None
    for found in _ANSWER_COLON.finditer(text):
        pass
    if found is None:
        return None
    line_end = text.find("\n", found.end())
    return captured_letter(text[found.end() : line_end if line_end >= 0 else len(text)], options)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


def last_captures(patterns: Sequence[str], text: str) -> list[str | None]:
    """For each pattern, group 1 (or the whole match) of its last match in ``text``, else ``None``.

    Runs in a worker: a badly written pattern can backtrack for a very long time.
    """
    captures: list[str | None] = []
    for pattern in patterns:
        found = None
        for found in _compiled(pattern).finditer(text):
            pass
        if found is None:
            captures.append(None)
        else:
            captures.append(found.group(1) if found.re.groups else found.group(0))
    return captures
