"""Verifiable instructions in the style of IFEval, implemented here from their public descriptions.

Each instruction is a small pydantic model registered under its IFEval id: its fields are the
instruction's keyword arguments (typed and validated; unknown keys are refused) and its
:meth:`Instruction.check` tells whether a response follows it, with a short reason::

    >>> rule = build("length_constraints:number_words", {"relation": "at least", "num_words": 3})
    >>> rule.check("One two three.")
    Check(followed=True, detail='3 words; needs at least 3')
    >>> build("punctuation:no_comma", None).check("Yes, indeed.").followed
    False

Counting conventions (documented so that scores are reproducible):

* a *word* is a run of Unicode word characters (``\\w+``), so ``don't`` is two words;
* a *sentence* ends at ``.``, ``!`` or ``?`` followed by whitespace, or at a blank line;
  common abbreviations (``Dr.``, ``e.g.``) and single-letter initials do not end one;
* ``***`` paragraphs are separated by a line holding only ``***``; ``\\n\\n`` paragraphs by a
  blank line;
* keywords match case-insensitively as whole words (not inside a longer word).

Every check runs in time linear in the length of the text (no backtracking-prone patterns).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "INSTRUCTIONS",
    "Check",
    "Instruction",
    "InstructionError",
    "Relation",
    "build",
    "count_sentences",
    "count_words",
    "register",
]

Relation = Literal["less than", "at least"]
"""How a count compares with its bound: ``count < n`` or ``count >= n``."""

Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
Phrase = Annotated[str, Field(min_length=1)]

INSTRUCTIONS: dict[str, type[Instruction]] = {}
"""Instruction id -> its class, e.g. ``"punctuation:no_comma"``."""


@dataclass(frozen=True)
class Check:
    """Outcome of checking one instruction: followed or not, and why (for logs and metrics)."""

    followed: bool
    detail: str


class InstructionError(ValueError):
    """An instruction id that is unknown, or keyword arguments it does not accept."""


class Instruction(BaseModel):
    """Base class: the fields are the instruction's kwargs; subclasses implement :meth:`check`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: ClassVar[str]

    def check(self, text: str) -> Check:
        """Whether ``text`` follows this instruction."""
        raise NotImplementedError


def register(instruction_id: str):
    """Class decorator registering an :class:`Instruction` under ``instruction_id``."""

    def decorate(cls: type[Instruction]) -> type[Instruction]:
        cls.id = instruction_id
        INSTRUCTIONS[instruction_id] = cls
        return cls

    return decorate


def build(instruction_id: str, kwargs: dict[str, Any] | None) -> Instruction:
    """The instruction ``instruction_id`` with ``kwargs`` (``None`` values are ignored, as in IFEval data).

    Raises:
        InstructionError: If the id is unknown or the kwargs are missing, unexpected or mistyped.
    """
    cls = INSTRUCTIONS.get(instruction_id)
    if cls is None:
        raise InstructionError(f"unknown instruction id {instruction_id!r}")
    values = {k: v for k, v in (kwargs or {}).items() if v is not None}
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'kwargs'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise InstructionError(f"invalid kwargs for {instruction_id!r}: {problems}") from None


# ---- text helpers ---------------------------------------------------------------------------

_WORD = re.compile(r"\w+")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+|\n[ \t]*\n\s*")
_ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "vs",
        "etc",
        "e.g",
        "i.e",
        "inc",
        "ltd",
        "co",
        "corp",
        "no",
        "fig",
        "approx",
        "dept",
        "est",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
    ]
)
_DIVIDER_LINE = re.compile(r"^[ \t]*\*\*\*[ \t]*$", re.MULTILINE)
_BLANK_LINE = re.compile(r"\n[ \t]*\n\s*")


def _compare(count: int, relation: Relation, bound: int) -> bool:
    return count < bound if relation == "less than" else count >= bound


def _relation_detail(count: int, noun: str, relation: Relation, bound: int) -> str:
    return f"{count} {noun}; needs {relation} {bound}"


def count_words(text: str) -> int:
    """Number of words (runs of word characters).

    >>> count_words("It's 9 a.m., time to go!")
    8
    """
    return sum(1 for _ in _WORD.finditer(text))


def count_sentences(text: str) -> int:
    """Number of sentences (see the module docstring for the rules).

    >>> count_sentences("Dr. Smith paid 3.50 for it, e.g. one coffee. Was he late? No!")
    3
    """
    count = 0
    pending = False  # the previous chunk ended in an abbreviation: it continues here
    for chunk in _SENTENCE_BREAK.split(text):
        if not _WORD.search(chunk):
            continue
        last = chunk.rstrip().rstrip(".").rsplit(None, 1)[-1].lower().lstrip("(\"'")
        continues = chunk.rstrip().endswith(".") and (
            last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())
        )
        if not pending:
            count += 1
        pending = continues
    return count


def _star_paragraphs(text: str) -> list[str]:
    return _DIVIDER_LINE.split(text)


def _first_word(paragraph: str) -> str:
    match = _WORD.search(paragraph)
    return match.group(0).lower() if match else ""


def _whole_word(phrase: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + re.escape(phrase.strip()) + r"(?!\w)", re.IGNORECASE)


# ---- length constraints -----------------------------------------------------------------------


@register("length_constraints:number_words")
class NumberWords(Instruction):
    """Answer with less than / at least ``num_words`` words."""

    num_words: Count
    relation: Relation

    def check(self, text: str) -> Check:
        n = count_words(text)
        return Check(
            _compare(n, self.relation, self.num_words),
            _relation_detail(n, "words", self.relation, self.num_words),
        )


@register("length_constraints:number_sentences")
class NumberSentences(Instruction):
    """Answer with less than / at least ``num_sentences`` sentences."""

    num_sentences: Count
    relation: Relation

    def check(self, text: str) -> Check:
        n = count_sentences(text)
        followed = _compare(n, self.relation, self.num_sentences)
        return Check(followed, _relation_detail(n, "sentences", self.relation, self.num_sentences))


@register("length_constraints:number_paragraphs")
class NumberParagraphs(Instruction):
    """Exactly ``num_paragraphs`` paragraphs, separated by a ``***`` line, none of them empty."""

    num_paragraphs: Positive

    def check(self, text: str) -> Check:
        parts = _star_paragraphs(text)
        # An empty chunk before the first or after the last divider is tolerated, not counted.
        while parts and not parts[0].strip():
            parts.pop(0)
        while parts and not parts[-1].strip():
            parts.pop()
        if any(not p.strip() for p in parts):
            return Check(False, "an empty paragraph between two *** dividers")
        return Check(
            len(parts) == self.num_paragraphs, f"{len(parts)} paragraphs; needs {self.num_paragraphs}"
        )


@register("length_constraints:nth_paragraph_first_word")
class NthParagraphFirstWord(Instruction):
    """Exactly ``num_paragraphs`` blank-line-separated paragraphs; paragraph ``nth_paragraph`` starts with ``first_word``."""

    num_paragraphs: Positive
    nth_paragraph: Positive
    first_word: Phrase

    def check(self, text: str) -> Check:
        paragraphs = [p for p in _BLANK_LINE.split(text) if p.strip()]
        if len(paragraphs) != self.num_paragraphs:
            return Check(False, f"{len(paragraphs)} paragraphs; needs {self.num_paragraphs}")
        if self.nth_paragraph > len(paragraphs):
            return Check(False, f"there is no paragraph {self.nth_paragraph}")
        word = _first_word(paragraphs[self.nth_paragraph - 1])
        wanted = self.first_word.strip().lower()
        return Check(word == wanted, f"paragraph {self.nth_paragraph} starts with {word!r}; needs {wanted!r}")


# ---- keywords ---------------------------------------------------------------------------------


@register("keywords:existence")
class KeywordsExistence(Instruction):
    """Every keyword appears (whole word, any case)."""

    keywords: list[Phrase] = Field(min_length=1)

    def check(self, text: str) -> Check:
        missing = [k for k in self.keywords if not _whole_word(k).search(text)]
        return Check(not missing, f"missing: {missing}" if missing else "all keywords present")


@register("keywords:forbidden_words")
class ForbiddenWords(Instruction):
    """None of the words appears (whole word, any case)."""

    forbidden_words: list[Phrase] = Field(min_length=1)

    def check(self, text: str) -> Check:
        used = [w for w in self.forbidden_words if _whole_word(w).search(text)]
        return Check(not used, f"uses: {used}" if used else "no forbidden word")


@register("keywords:frequency")
class KeywordFrequency(Instruction):
    """``keyword`` appears less than / at least ``frequency`` times (whole word, any case)."""

    keyword: Phrase
    frequency: Count
    relation: Relation

    def check(self, text: str) -> Check:
        n = sum(1 for _ in _whole_word(self.keyword).finditer(text))
        noun = f"occurrences of {self.keyword!r}"
        return Check(
            _compare(n, self.relation, self.frequency),
            _relation_detail(n, noun, self.relation, self.frequency),
        )


@register("keywords:letter_frequency")
class LetterFrequency(Instruction):
    """The letter appears less than / at least ``let_frequency`` times (any case)."""

    letter: str
    let_frequency: Count
    let_relation: Relation

    @field_validator("letter")
    @classmethod
    def _one_letter(cls, value: str) -> str:
        if len(value) != 1 or not value.isalpha():
            raise ValueError("must be a single letter")
        return value

    def check(self, text: str) -> Check:
        n = text.casefold().count(self.letter.casefold())
        detail = _relation_detail(n, f"letters {self.letter!r}", self.let_relation, self.let_frequency)
        return Check(_compare(n, self.let_relation, self.let_frequency), detail)


# ---- detectable format ------------------------------------------------------------------------

_JSON_FENCE = re.compile(r"^```[ \t]*(?:json)?[ \t]*\n?(.*?)\n?```$", re.IGNORECASE | re.DOTALL)
_BULLET = re.compile(r"^[ \t]*[*-][ \t]+\S", re.MULTILINE)
_BULLET_MARKER = re.compile(r"^[ \t]*[*-][ \t]+", re.MULTILINE)
_HIGHLIGHT = re.compile(r"\*\*[^\n*]+\*\*|\*[^\n*]+\*")
_TITLE = re.compile(r"<<([^\n<>]*)>>")
_PLACEHOLDER = re.compile(r"\[([^\[\]\n]*)\]")
_ANSWER_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


@register("detectable_format:json_format")
class JsonFormat(Instruction):
    """The whole response is JSON (optionally inside one ```json fenced block)."""

    def check(self, text: str) -> Check:
        body = text.strip()
        fenced = _JSON_FENCE.match(body)
        if fenced:
            body = fenced.group(1).strip()
        try:
            json.loads(body)
        except (ValueError, RecursionError) as exc:
            return Check(False, f"not JSON: {str(exc)[:100]}")
        return Check(True, "valid JSON")


@register("detectable_format:number_bullet_lists")
class NumberBulletLists(Instruction):
    """Exactly ``num_bullets`` markdown bullet points (lines starting with ``* `` or ``- ``)."""

    num_bullets: Count

    def check(self, text: str) -> Check:
        n = sum(1 for _ in _BULLET.finditer(text))
        return Check(n == self.num_bullets, f"{n} bullet points; needs exactly {self.num_bullets}")


@register("detectable_format:number_highlighted_sections")
class NumberHighlightedSections(Instruction):
    """At least ``num_highlights`` non-empty sections highlighted with markdown, ``*like this*``."""

    num_highlights: Count

    def check(self, text: str) -> Check:
        # Bullet markers and *** dividers are not highlights: drop them before matching.
        body = _BULLET_MARKER.sub("", _DIVIDER_LINE.sub("", text))
        n = sum(1 for m in _HIGHLIGHT.finditer(body) if m.group(0).strip("*").strip())
        return Check(
            n >= self.num_highlights, f"{n} highlighted sections; needs at least {self.num_highlights}"
        )


@register("detectable_format:multiple_sections")
class MultipleSections(Instruction):
    """At least ``num_sections`` sections, each marked ``<section_spliter> <number>`` (e.g. ``SECTION 1``)."""

    section_spliter: Phrase
    num_sections: Positive

    def check(self, text: str) -> Check:
        marker = re.compile(r"(?<!\w)" + re.escape(self.section_spliter.strip()) + r"[ \t]*\d+")
        n = sum(1 for _ in marker.finditer(text))
        return Check(n >= self.num_sections, f"{n} section markers; needs at least {self.num_sections}")


@register("detectable_format:title")
class Title(Instruction):
    """A title wrapped in double angular brackets, such as ``<<poem of joy>>``."""

    def check(self, text: str) -> Check:
        titles = [m.group(1).strip() for m in _TITLE.finditer(text) if m.group(1).strip()]
        return Check(bool(titles), f"title {titles[0]!r}" if titles else "no <<title>>")


@register("detectable_format:constrained_response")
class ConstrainedResponse(Instruction):
    """Contains one of ``My answer is yes.``, ``My answer is no.``, ``My answer is maybe.``."""

    def check(self, text: str) -> Check:
        found = [o for o in _ANSWER_OPTIONS if o in text]
        return Check(bool(found), f"says {found[0]!r}" if found else "none of the allowed answers")


# ---- detectable content -----------------------------------------------------------------------


@register("detectable_content:number_placeholders")
class NumberPlaceholders(Instruction):
    """At least ``num_placeholders`` placeholders in square brackets, such as ``[address]``."""

    num_placeholders: Count

    def check(self, text: str) -> Check:
        n = sum(1 for m in _PLACEHOLDER.finditer(text) if m.group(1).strip())
        return Check(n >= self.num_placeholders, f"{n} placeholders; needs at least {self.num_placeholders}")


@register("detectable_content:postscript")
class Postscript(Instruction):
    """A line starting with ``postscript_marker`` (e.g. ``P.S.``; any case, spaces after dots allowed)."""

    postscript_marker: Phrase

    def check(self, text: str) -> Check:
        marker = self.postscript_marker.strip()
        *dotted, last = marker.split(".")
        pieces = [re.escape(part) + r"\." for part in dotted] + ([re.escape(last)] if last else [])
        pattern = r"\s*".join(pieces)
        found = re.search(r"^[ \t]*" + pattern, text, re.IGNORECASE | re.MULTILINE)
        return Check(
            bool(found), f"postscript starting {marker!r}" if found else f"no line starting with {marker!r}"
        )


# ---- change case ------------------------------------------------------------------------------


@register("change_case:english_lowercase")
class EnglishLowercase(Instruction):
    """All letters lowercase (at least one letter; the language is not checked)."""

    def check(self, text: str) -> Check:
        upper = next((c for c in text if c.isupper()), None)
        if upper is not None:
            return Check(False, f"has the capital letter {upper!r}")
        return Check(any(c.islower() for c in text), "all lowercase")


@register("change_case:english_capital")
class EnglishCapital(Instruction):
    """All letters capital (at least one letter; the language is not checked)."""

    def check(self, text: str) -> Check:
        lower = next((c for c in text if c.islower()), None)
        if lower is not None:
            return Check(False, f"has the lowercase letter {lower!r}")
        return Check(any(c.isupper() for c in text), "all capitals")


@register("change_case:capital_word_frequency")
class CapitalWordFrequency(Instruction):
    """Less than / at least ``capital_frequency`` words written in all capitals."""

    capital_frequency: Count
    capital_relation: Relation

    def check(self, text: str) -> Check:
        n = sum(1 for m in _WORD.finditer(text) if m.group(0).isupper())
        detail = _relation_detail(n, "all-capital words", self.capital_relation, self.capital_frequency)
        return Check(_compare(n, self.capital_relation, self.capital_frequency), detail)


# ---- start / end, punctuation, combination ----------------------------------------------------


@register("startend:end_checker")
class EndChecker(Instruction):
    """Ends with ``end_phrase`` exactly (any case), nothing after it."""

    end_phrase: Phrase

    def check(self, text: str) -> Check:
        wanted = self.end_phrase.strip().lower()
        followed = text.strip().lower().endswith(wanted)
        return Check(
            followed, "ends with the phrase" if followed else f"does not end with {self.end_phrase!r}"
        )


@register("startend:quotation")
class Quotation(Instruction):
    """The whole response is wrapped in double quotation marks (``"..."`` or curly)."""

    def check(self, text: str) -> Check:
        body = text.strip()
        followed = len(body) >= 2 and (
            (body[0] == '"' and body[-1] == '"') or (body[0] == "\u201c" and body[-1] == "\u201d")
        )
        return Check(followed, "wrapped in quotes" if followed else "not wrapped in double quotes")


@register("punctuation:no_comma")
class NoComma(Instruction):
    """No commas at all (ASCII ``,`` or full-width ``，``)."""

    def check(self, text: str) -> Check:
        n = text.count(",") + text.count("\uff0c")
        return Check(n == 0, f"{n} commas")


@register("combination:repeat_prompt")
class RepeatPrompt(Instruction):
    """Starts by repeating ``prompt_to_repeat`` word for word (any case, whitespace runs equal)."""

    prompt_to_repeat: Phrase

    def check(self, text: str) -> Check:
        wanted = " ".join(self.prompt_to_repeat.split()).lower()
        # Only the first len(wanted) characters matter; normalise no more than a margin beyond them.
        head = " ".join(text[: 2 * len(self.prompt_to_repeat) + 64].split()).lower()
        followed = head.startswith(wanted)
        return Check(followed, "starts with the prompt" if followed else "does not start with the prompt")


@register("combination:two_responses")
class TwoResponses(Instruction):
    """Two different responses separated by six asterisks ``******``."""

    def check(self, text: str) -> Check:
        parts = [p.strip() for p in re.split(r"\*{6,}", text)]
        inner = parts[1:-1]
        if any(not p for p in inner):
            return Check(False, "an empty response between separators")
        responses = [p for p in parts if p]
        if len(responses) != 2:
            return Check(False, f"{len(responses)} responses; needs 2")
        return Check(
            responses[0] != responses[1],
            "two different responses" if responses[0] != responses[1] else "the two responses are identical",
        )
