"""Answer extraction: the last assistant message, then ``<answer>``, ``\\boxed{}``, the whole text."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import times_slower_than_plain
from nemo_gym_env.servers.reasoning_gym import answers
from nemo_gym_env.servers.reasoning_gym.answers import answer_tag, boxed, extract_answer, final_text

TAGLESS = st.text().filter(lambda s: "<answer>" not in s and "</answer>" not in s)


def test_doctest() -> None:
    assert doctest.testmod(answers).failed == 0


@given(TAGLESS, TAGLESS, TAGLESS)
def test_answer_tag_is_the_stripped_content(before: str, inside: str, after: str) -> None:
    assert answer_tag(f"{before}<answer>{inside}</answer>{after}") == inside.strip()


@given(TAGLESS)
def test_no_tag_no_answer(text: str) -> None:
    assert answer_tag(text) is None
    assert extract_answer(text, "none") == (None, None)


@given(st.lists(TAGLESS, min_size=1, max_size=5))
def test_last_of_several_tags(contents: list[str]) -> None:
    text = " ".join(f"<answer>{c}</answer>" for c in contents)
    assert answer_tag(text) == contents[-1].strip()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>1</answer><answer>2", "1"),  # an unclosed last tag does not count
        ("<answer>1<answer>2</answer>", "2"),
        ("</answer><answer>1", None),
        ("<ANSWER>1</ANSWER>", None),
        ("<answer></answer>", ""),
    ],
)
def test_answer_tag_edges(text: str, expected: str | None) -> None:
    assert answer_tag(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{42}", "42"),
        (r"\boxed{\frac{1}{2}} and later \boxed{7}", "7"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{1} then \boxed{2", "1"),
        (r"\boxed{", None),
        ("no box", None),
    ],
)
def test_boxed(text: str, expected: str | None) -> None:
    assert boxed(text) == expected


def test_fallback_order() -> None:
    text = r"<answer>a</answer> \boxed{b}"
    assert extract_answer(text, "none") == ("a", "answer_tag")
    assert extract_answer(r"x \boxed{b}", "none") == (None, None)
    assert extract_answer(r"x \boxed{b}", "boxed") == ("b", "boxed")
    assert extract_answer(r"x \boxed{b}", "full_text") == ("b", "boxed")
    assert extract_answer("  plain  ", "boxed") == (None, None)
    assert extract_answer("  plain  ", "full_text") == ("plain", "full_text")
    assert extract_answer("   ", "full_text") == (None, None)
    assert extract_answer(None, "full_text") == (None, None)
    with pytest.raises(ValueError, match="full_text"):
        extract_answer("x", "everything")  # type: ignore[arg-type]


def test_final_text_reads_the_last_assistant_message_only() -> None:
    output = make_response(
        [
            {
                "type": "message",
                "role": "assistant",
                "id": "m1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "<answer>1</answer>"}],
            },
            {
                "type": "reasoning",
                "id": "r1",
                "summary": [{"type": "summary_text", "text": "<answer>2</answer>"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc1"},
            {"type": "function_call_output", "call_id": "c1", "output": "<answer>3</answer>"},
            {
                "type": "message",
                "role": "assistant",
                "id": "m2",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": "<answer>"},
                    {"type": "refusal", "refusal": "no"},
                    {"type": "output_text", "text": "4</answer>"},
                ],
            },
        ]
    ).output
    assert final_text(output) == "<answer>4</answer>"
    assert final_text(output[1:4]) is None
    assert final_text([]) is None
    assert final_text([{"type": "message", "role": "assistant", "content": "plain"}]) == "plain"


@pytest.mark.parametrize("fallback", ["boxed", "full_text"])
def test_adversarial_text_is_linear(fallback: str) -> None:
    junk = ("\\boxed{{{" + "<answer>") * 200_000  # ~3.4 MB: unclosed boxes and tags everywhere
    assert times_slower_than_plain(lambda t: extract_answer(t, fallback), junk) < 50  # type: ignore[arg-type]
