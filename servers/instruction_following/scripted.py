"""Deterministic scripted player for ``instruction_following`` (tests, quickstart, benchmarks).

Not a model: it reads the row's ``instruction_id_list`` and ``kwargs`` and writes, in one
assistant message, a text built to follow every instruction (``correct=True``; compatible
combinations only, such as those in ``data/example.jsonl``) or one that breaks at least one
of them (``correct=False``).

Example:
    >>> row = {"instruction_id_list": ["punctuation:no_comma", "detectable_format:title"],
    ...        "kwargs": [None, {}]}
    >>> text = scripted_action(row, [])[0]["content"][0]["text"]
    >>> text.startswith("<<") and "," not in text
    True
    >>> "<<" in scripted_action(row, [], correct=False)[0]["content"][0]["text"]
    False
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message
from nemo_gym_env.servers.instruction_following.instructions import InstructionError, build

__all__ = ["compose", "scripted_action", "violate"]

_POOL = (
    "this answer stays short and clear.",
    "each point follows from the one before it.",
    "small steps make the whole task simpler to follow.",
    "good notes help when you come back to the topic later.",
    "plain words often explain things best.",
    "there is more to say but this covers the main idea.",
    "practice turns a new habit into a routine.",
    "clear goals help you decide what to do next.",
)


def _pool(spec: dict[str, dict[str, Any]]) -> list[str]:
    """Filler sentences that use no forbidden word, no capped keyword and no capped letter."""
    banned = [w.lower() for w in spec.get("keywords:forbidden_words", {}).get("forbidden_words", [])]
    frequency = spec.get("keywords:frequency", {})
    if frequency.get("relation") == "less than":
        banned.append(str(frequency.get("keyword", "")).lower())
    letters = spec.get("keywords:letter_frequency", {})
    letter = str(letters.get("letter", "")).lower() if letters.get("let_relation") == "less than" else ""
    usable = [
        s
        for s in _POOL
        if not any(b and b in s.replace(".", "").split() for b in banned) and not (letter and letter in s)
    ]
    return usable or ["ok."]


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] if text else text


def _body(spec: dict[str, dict[str, Any]], pool: list[str]) -> list[str]:
    """Paragraphs of the main answer, before length padding."""
    extra: list[str] = []
    if "keywords:existence" in spec:
        extra.append(f"it touches on {' and '.join(spec['keywords:existence']['keywords'])}.")
    frequency = spec.get("keywords:frequency", {})
    if frequency.get("relation") == "at least":
        extra.append(" ".join([frequency["keyword"]] * int(frequency["frequency"])) + ".")
    letters = spec.get("keywords:letter_frequency", {})
    if letters.get("let_relation") == "at least":
        extra.append(f"{letters['letter'].lower() * int(letters['let_frequency'])}.")
    capitals = spec.get("change_case:capital_word_frequency", {})
    if capitals.get("capital_relation") == "at least":
        extra.append(" ".join(["NOTE"] * int(capitals["capital_frequency"])) + ".")
    if "detectable_content:number_placeholders" in spec:
        n = int(spec["detectable_content:number_placeholders"]["num_placeholders"])
        extra.append(" ".join(f"[detail {i + 1}]" for i in range(n)) + " go here.")
    if "detectable_format:number_highlighted_sections" in spec:
        n = int(spec["detectable_format:number_highlighted_sections"]["num_highlights"])
        extra.extend(f"*{pool[i % len(pool)].rstrip('.')}*." for i in range(n))
    if "detectable_format:constrained_response" in spec:
        extra.append("My answer is yes.")

    count = 1
    if "length_constraints:number_paragraphs" in spec:
        count = int(spec["length_constraints:number_paragraphs"]["num_paragraphs"])
    elif "length_constraints:nth_paragraph_first_word" in spec:
        count = int(spec["length_constraints:nth_paragraph_first_word"]["num_paragraphs"])
    count = max(count, int(spec.get("detectable_format:multiple_sections", {}).get("num_sections", 1)))
    paragraphs = [_sentence(pool[i % len(pool)]) for i in range(count)]
    for i, sentence in enumerate(extra):
        paragraphs[i % count] += " " + sentence
    nth = spec.get("length_constraints:nth_paragraph_first_word")
    if nth and int(nth["nth_paragraph"]) <= count:
        index = int(nth["nth_paragraph"]) - 1
        paragraphs[index] = f"{nth['first_word']} {paragraphs[index]}"
    sections = spec.get("detectable_format:multiple_sections")
    if sections:
        splitter = sections["section_spliter"].strip()
        paragraphs = [f"{splitter} {i + 1}\n{p}" for i, p in enumerate(paragraphs)]
    if "detectable_format:number_bullet_lists" in spec:
        n = int(spec["detectable_format:number_bullet_lists"]["num_bullets"])
        paragraphs[-1] += "".join(f"\n* {pool[i % len(pool)]}" for i in range(n))
    return paragraphs


def compose(row: dict[str, Any]) -> str:
    """A text meant to follow every instruction of ``row`` (compatible combinations only)."""
    spec = {i: dict(k or {}) for i, k in zip(row["instruction_id_list"], row["kwargs"])}
    spec = {i: {k: v for k, v in kw.items() if v is not None} for i, kw in spec.items()}
    pool = _pool(spec)
    paragraphs = _body(spec, pool)
    divider = "\n***\n" if "length_constraints:number_paragraphs" in spec else "\n\n"

    def assemble(pad: int) -> str:
        padded = list(paragraphs)
        padded[-1] += "".join(" " + _sentence(pool[i % len(pool)]) for i in range(pad))
        text = divider.join(padded)
        if "detectable_format:title" in spec:
            text = "<<a short answer>>\n\n" + text
        if "combination:repeat_prompt" in spec:
            text = spec["combination:repeat_prompt"]["prompt_to_repeat"].strip() + "\n\n" + text
        if "combination:two_responses" in spec:
            text = f"{text}\n******\nanother version. {text}"
        if "detectable_content:postscript" in spec:
            text += f"\n\n{spec['detectable_content:postscript']['postscript_marker'].strip()} thanks for reading."
        if "startend:end_checker" in spec:
            text += " " + spec["startend:end_checker"]["end_phrase"].strip()
        if "detectable_format:json_format" in spec:
            text = json.dumps({"answer": text}, ensure_ascii=False)
        if "startend:quotation" in spec:
            text = f'"{text}"'
        if "change_case:english_lowercase" in spec:
            text = text.lower()
        if "change_case:english_capital" in spec:
            text = text.upper()
        return text

    for pad in range(10_000):  # grow until every "at least" length bound holds
        text = assemble(pad)
        if _lengths_hold(spec, text):
            break
    return text


def _lengths_hold(spec: dict[str, dict[str, Any]], text: str) -> bool:
    for instruction_id in ("length_constraints:number_words", "length_constraints:number_sentences"):
        kwargs = spec.get(instruction_id)
        if (
            kwargs
            and kwargs.get("relation") == "at least"
            and not build(instruction_id, kwargs).check(text).followed
        ):
            return False
    return True


def violate(row: dict[str, Any], text: str) -> str:
    """A text that breaks at least one instruction of ``row`` (tried in order, checked with the verifier's rules)."""
    words = []
    for kwargs in row["kwargs"]:
        for value in (kwargs or {}).values():
            words.extend(value if isinstance(value, list) else [value])
    noise = " ".join(str(w) for w in words if isinstance(w, str))
    candidates = [
        "ok",
        text + "\n\n" + ("Well, THAT is " + noise + ". ") * 300,
        text.upper(),
        text.lower(),
        text.replace("***", "").replace("******", ""),
    ]
    for candidate in candidates:
        for instruction_id, kwargs in zip(row["instruction_id_list"], row["kwargs"]):
            try:
                if not build(instruction_id, kwargs).check(candidate).followed:
                    return candidate
            except InstructionError:
                return candidate
    return candidates[0]


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """One assistant message following (``correct=True``) or breaking the row's instructions.

    Args:
        row: The dataset row being played (``instruction_id_list`` and ``kwargs`` are read).
        history: The items the environment has shown since reset (unused: one turn).
        correct: Follow every instruction (reward 1.0) or break at least one (0.0 in binary mode).
    """
    text = compose(row)
    if not correct:
        text = violate(row, text)
    return [assistant_message(text, "msg_0")]
