"""Items as plain data (``protocol.items``): what kind an item is, whether the model wrote it, its
text, and the one check of a model turn. Pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import ResponseOutputText

from nemo_gym_env.protocol.items import (
    ACTION_ITEM_TYPES,
    ITEM_TYPES,
    MODEL_ITEM_TYPES,
    check_turn,
    content_text,
    is_model_item,
    item_kind,
    plain,
    reasoning_text,
)
from nemo_gym_env.protocol.scripting import assistant_message, function_call, reasoning
from nemo_gym_env.protocol.types import FunctionCall, FunctionCallOutput, make_response


def test_the_item_type_tables_nest():
    assert set(MODEL_ITEM_TYPES) < set(ACTION_ITEM_TYPES) < set(ITEM_TYPES)
    assert "function_call_output" in ITEM_TYPES and "function_call_output" not in ACTION_ITEM_TYPES


def test_plain_dumps_sdk_and_pydantic_objects_and_leaves_data_alone():
    assert plain(FunctionCallOutput(call_id="c1", output="ok")) == {
        "call_id": "c1", "output": "ok", "type": "function_call_output"}
    assert plain(ResponseOutputText(type="output_text", text="hi", annotations=[])) == {
        "type": "output_text", "text": "hi", "annotations": []}
    call = FunctionCall(call_id="c", name="f", arguments="{}")
    assert "id" not in plain(call)  # None fields are left out, as items travel
    data = {"type": "message"}
    assert plain(data) is data and plain("text") == "text" and plain(3) == 3


@pytest.mark.parametrize(
    ("item", "kind"),
    [
        ({"type": "function_call"}, "function_call"),
        ({"role": "user", "content": "hi"}, "message"),  # EasyInputMessage: no type
        ({"type": "reasoning", "role": "assistant"}, "reasoning"),
        ({"content": "no type, no role"}, None),
        ({"type": 5}, None),
        ("message", None),
        (None, None),
    ],
)
def test_item_kind(item, kind):
    assert item_kind(item) == kind


@pytest.mark.parametrize(
    ("item", "model"),
    [
        (function_call(0, 0, "f", {}), True),
        (reasoning("hmm"), True),
        (assistant_message("hi"), True),
        ({"role": "assistant", "content": "hi"}, True),
        ({"role": "user", "content": "hi"}, False),
        ({"type": "message", "role": "system", "content": "x"}, False),
        ({"type": "function_call_output", "call_id": "c", "output": "{}"}, False),
        ({}, False),
    ],
)
def test_is_model_item(item, model):
    assert is_model_item(item) is model


def test_content_text_joins_text_and_refusal_parts():
    assert content_text(None) == "" and content_text("plain") == "plain"
    parts = [{"type": "output_text", "text": "a"}, {"type": "refusal", "refusal": "b"}, "c",
             {"type": "input_image", "image_url": "x"},
             ResponseOutputText(type="output_text", text="d", annotations=[])]
    assert content_text(parts) == "abcd"


def test_reasoning_text_reads_the_summary_else_the_content():
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": " one "},
                                             {"type": "summary_text", "text": ""},
                                             {"type": "summary_text", "text": "two"}]}
    assert reasoning_text(item) == "one\n\ntwo"
    from_content = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]}
    assert reasoning_text(from_content) == "x"
    assert reasoning_text({"type": "reasoning"}) == ""


def test_check_turn_accepts_a_model_turn_and_says_where_one_is_wrong():
    assert check_turn([reasoning("r"), function_call(0, 0, "f", {"a": 1}), assistant_message("m")]) is None
    assert check_turn([]) is None
    problem = check_turn([assistant_message("ok"), {"type": "function_call", "name": 5, "arguments": "{}"}])
    assert problem is not None and problem.startswith("1.")
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    deep = {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c", "extra": nested}
    assert check_turn([deep]) is None  # unknown keys ride along, however deep


MODEL_ITEMS = [assistant_message("a"), reasoning("b"), function_call(1, 2, "f", {"k": [1]})]


@given(st.lists(st.sampled_from(MODEL_ITEMS), max_size=6))
def test_check_turn_agrees_with_the_wire_types(items):
    assert check_turn(items) is None
    assert len(make_response(items).output) == len(items)
