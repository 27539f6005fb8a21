"""Tests for nemo_gym_env.protocol.parser: parse_model_text, render_tool_call, items_to_text."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_env.envs.spaces import JsonItems
from nemo_gym_env.protocol.parser import items_to_text, parse_model_text, render_tool_call

FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "call>",
    "{",
    "}",
    "[",
    "]",
    '"name"',
    '"arguments"',
    '"parameters"',
    ":",
    ",",
    '"f"',
    '"x"',
    "1",
    "null",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "arguments": "{\\"b\\": 2}"}',
    '{"name": "h", "parameters": {}}',
    '{"name": 3}',
    '"\\u003c/tool_call>"',
    '"</think>"',
    "\n",
    " ",
    "hello",
    "ü🙂",
]

fragment_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=25).map("".join)
any_text = st.one_of(st.text(), fragment_text)

FAST = settings(max_examples=200, deadline=None)


def strip_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


def message_text(items: list[dict]) -> str | None:
    for item in items:
        if item["type"] == "message":
            return item["content"][0]["text"]
    return None


def calls(items: list[dict]) -> list[tuple[str, str]]:
    return [(i["name"], i["arguments"]) for i in items if i["type"] == "function_call"]


# ---------------------------------------------------------------- properties


@FAST
@given(any_text)
def test_parse_never_raises_and_items_are_json(text: str) -> None:
    items = parse_model_text(text)
    space = JsonItems()
    for item in items:
        assert space.contains([item])
        json.dumps(item, ensure_ascii=False)
    kinds = [item["type"] for item in items]
    # reasoning first, then message, then calls; at most one reasoning and one message
    assert kinds == sorted(kinds, key=["reasoning", "message", "function_call"].index)
    assert kinds.count("reasoning") <= 1 and kinds.count("message") <= 1


@FAST
@given(any_text)
def test_round_trip(text: str) -> None:
    items = parse_model_text(text)
    again = parse_model_text(items_to_text(items))
    assert strip_ids(again) == strip_ids(items)


@FAST
@given(any_text)
def test_id_prefix_is_deterministic(text: str) -> None:
    first = parse_model_text(text, id_prefix="t")
    assert first == parse_model_text(text, id_prefix="t")
    for i, item in enumerate(first):
        kind = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[item["type"]]
        assert item["id"] == f"{kind}_t_{i}"
        if item["type"] == "function_call":
            assert item["call_id"] == f"call_t_{i}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)


@FAST
@given(st.text(max_size=10), st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_render_tool_call_parses_back(name: str, arguments: dict) -> None:
    items = parse_model_text(render_tool_call(name, arguments))
    assert calls(items) == [(name, json.dumps(arguments, ensure_ascii=False))]
    assert message_text(items) is None


@FAST
@given(st.text(max_size=10), st.text(max_size=20))
def test_render_tool_call_string_arguments_verbatim(name: str, arguments: str) -> None:
    assert calls(parse_model_text(render_tool_call(name, arguments))) == [(name, arguments)]


# ---------------------------------------------------------------- specific cases


def test_plain_text() -> None:
    assert parse_model_text("  Hello world \n", id_prefix="a") == [
        {
            "type": "message",
            "id": "msg_a_0",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello world", "annotations": []}],
        }
    ]


def test_empty_text_gives_no_items() -> None:
    assert parse_model_text("") == []
    assert parse_model_text("  \n <think> </think> ") == []


def test_random_ids() -> None:
    (first,) = parse_model_text("hi")
    (second,) = parse_model_text("hi")
    assert first["id"].startswith("msg_") and len(first["id"]) == 4 + 32
    assert first["id"] != second["id"]


def test_think_then_text() -> None:
    items = parse_model_text("<think>\nLet me think.\n</think>\n\nThe answer is 4.", id_prefix="a")
    assert items[0] == {
        "type": "reasoning",
        "id": "rs_a_0",
        "summary": [{"type": "summary_text", "text": "Let me think."}],
    }
    assert message_text(items) == "The answer is 4."
    assert items[1]["id"] == "msg_a_1"


def test_several_think_blocks_are_joined() -> None:
    items = parse_model_text("<think>one</think>A<think> two </think>B")
    assert items[0]["summary"][0]["text"] == "one\n\ntwo"
    assert message_text(items) == "AB"


def test_unterminated_think_runs_to_end() -> None:
    items = parse_model_text('<think>still thinking <tool_call>{"name": "f"}</tool_call>')
    assert [i["type"] for i in items] == ["reasoning"]
    assert items[0]["summary"][0]["text"].startswith("still thinking <tool_call>")


def test_close_without_open_is_qwen3_reasoning() -> None:
    items = parse_model_text("I should add.\n</think>\n\n4")
    assert items[0]["summary"][0]["text"] == "I should add."
    assert message_text(items) == "4"


def test_stray_close_think_is_dropped() -> None:
    assert message_text(parse_model_text("<think>r</think>a</think>b")) == "ab"


def test_two_tool_calls_in_order() -> None:
    text = (
        "Let me look.\n"
        '<tool_call>\n{"name": "search", "arguments": {"q": "paris", "k": 3}}\n</tool_call>\n'
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
    )
    items = parse_model_text(text, id_prefix="z")
    assert message_text(items) == "Let me look."
    assert items[1] == {
        "type": "function_call",
        "id": "fc_z_1",
        "call_id": "call_z_1",
        "name": "search",
        "arguments": '{"q": "paris", "k": 3}',
        "status": "completed",
    }
    assert calls(items) == [
        ("search", '{"q": "paris", "k": 3}'),
        ("get_weather", '{"city": "Paris"}'),
    ]


def test_arguments_as_string_kept_verbatim() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\":1, bad"}</tool_call>'
    assert calls(parse_model_text(text)) == [("f", '{"a":1, bad')]


def test_parameters_alias_and_missing_arguments() -> None:
    assert calls(parse_model_text('<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>')) == [
        ("f", '{"a": 1}')
    ]
    assert calls(parse_model_text('<tool_call>{"name": "f"}</tool_call>')) == [("f", "{}")]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>["name", "f"]</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        "<tool_call></tool_call>",
        "<tool_call>" + "[" * 5000 + "</tool_call>",
    ],
)
def test_malformed_tool_call_stays_text(block: str) -> None:
    items = parse_model_text(f"Before {block} after")
    assert calls(items) == []
    assert message_text(items) == f"Before {block} after"


def test_malformed_and_valid_calls_mixed() -> None:
    text = '<tool_call>oops</tool_call> then <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    items = parse_model_text(text)
    assert message_text(items) == "<tool_call>oops</tool_call> then"
    assert calls(items) == [("f", "{}")]


def test_unterminated_tool_call_is_text() -> None:
    text = 'Calling <tool_call>{"name": "f", "argum'
    items = parse_model_text(text)
    assert calls(items) == []
    assert message_text(items) == text


def test_nested_braces_and_unicode_arguments() -> None:
    arguments = {"q": "naïve café 🙂 {x}", "nested": {"a": [1, {"b": "}"}], "c": "</think>"}}
    text = f"<think>plan</think>{render_tool_call('lookup', arguments)}"
    items = parse_model_text(text)
    assert calls(items) == [("lookup", json.dumps(arguments, ensure_ascii=False))]
    assert "🙂" in items[-1]["arguments"]


def test_escaped_closing_tag_inside_arguments() -> None:
    rendered = render_tool_call("f", {"s": "</tool_call><tool_call>"})
    assert rendered.count("</tool_call>") == 1
    assert calls(parse_model_text(rendered)) == [("f", '{"s": "</tool_call><tool_call>"}')]


def test_removed_block_cannot_forge_a_tag() -> None:
    items = parse_model_text('<think></think>x<tool_<think>r</think>call>{"name": "f"}</tool_call>')
    assert calls(items) == []
    assert calls(parse_model_text(items_to_text(items))) == []


# ---------------------------------------------------------------- items_to_text


def test_items_to_text_format() -> None:
    items = parse_model_text('<think>r</think>Hi<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    assert items_to_text(items) == (
        '<think>\nr\n</think>\n\nHi\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )


def test_items_to_text_accepts_easy_messages_and_rejects_outputs() -> None:
    assert items_to_text([{"role": "assistant", "content": "ok"}]) == "ok"
    with pytest.raises(ValueError):
        items_to_text([{"type": "function_call_output", "call_id": "c", "output": "x"}])


def test_round_trip_unterminated_call_after_valid_call() -> None:
    items = parse_model_text('<tool_call>{"name": "f"}</tool_call> hi <tool_call>{')
    assert strip_ids(parse_model_text(items_to_text(items))) == strip_ids(items)


# ---------------------------------------------------------------- performance


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" * 200_000,
        "<tool_call>{" * 150_000 + "</tool_call>",
        "<think>" * 300_000,
        "</think>" * 250_000,
        "<think></think>" * 150_000,
        '<tool_call>{"name": "f"}</tool_call>' * 60_000,
        "<tool_call>x</tool_call>" * 90_000,
        "a" * 2_000_000,
        "<tool_call>" + "{" * 1_000_000 + "</tool_call>",
        "<tool_call>" + '{"a":' * 300_000 + "</tool_call>",
    ],
    ids=lambda t: repr(t[:24]),
)
def test_huge_adversarial_input_is_fast(text: str) -> None:
    assert len(text) >= 1_000_000
    start = time.perf_counter()
    parse_model_text(text)
    assert time.perf_counter() - start < 5.0
