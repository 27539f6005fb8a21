"""What a model turn may be (``envs.actions.normalize_action``): text, items, SDK objects and
Responses, normalised into wire-ready items with deterministic ids, and every refusal with its
message. Pure functions; the fuzzing of this path lives in ``tests/reliability/test_hostile_input.py``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.errors import ActionError, NemoGymError
from nemo_gym_env.protocol.items import check_turn
from nemo_gym_env.protocol.types import make_response

CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Lima"}'}
ANSWER = {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "Cold.", "annotations": []}]}


# ---- text -----------------------------------------------------------------------------------


def test_text_becomes_a_message():
    assert normalize_action("It is cold.", turn=2) == [
        {"type": "message", "id": "msg_t2_0", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "It is cold.", "annotations": []}]}
    ]


def test_text_with_think_and_a_tool_call_becomes_reasoning_and_a_call():
    text = ('<think>Need the weather.</think>'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>')
    items = normalize_action(text, turn=1)
    assert [item["type"] for item in items] == ["reasoning", "function_call"]
    assert items[0]["summary"][0]["text"] == "Need the weather."
    assert (items[1]["name"], items[1]["arguments"], items[1]["call_id"]) == (
        "get_weather", '{"city": "Lima"}', "call_t1_1")


def test_empty_text_is_an_empty_turn():
    assert normalize_action("", turn=0) == []


@given(text=st.text(alphabet=st.characters(exclude_categories=["Cs"])), turn=st.integers(0, 10**6))
def test_any_text_gives_valid_items_with_ids_from_the_turn(text: str, turn: int) -> None:
    items = normalize_action(text, turn=turn)
    assert items == normalize_action(text, turn=turn)  # same text, same turn: same items
    assert check_turn(items) is None
    json.dumps(items, allow_nan=False).encode()
    for item in items:
        assert item["type"] in ("message", "function_call", "reasoning")
        assert f"_t{turn}_" in item["id"]


# ---- items, SDK objects, Responses -----------------------------------------------------------


def test_items_get_defaults_and_ids_and_the_caller_keeps_its_own():
    easy = {"role": "assistant", "content": "Cold."}
    call = {"type": "function_call", "name": "get_weather", "arguments": {"city": "Zürich", "a": [1]}}
    action = [easy, call]
    original = copy.deepcopy(action)
    items = normalize_action(action, turn=4)
    assert items == [
        {"role": "assistant", "type": "message", "status": "completed", "id": "msg_t4_0",
         "content": [{"type": "output_text", "text": "Cold.", "annotations": []}]},
        {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Zürich", "a": [1]}',
         "call_id": "call_t4_1", "id": "fc_t4_1"},
    ]
    assert action == original  # the caller's items are not modified
    assert normalize_action(tuple(action), turn=4) == items


def test_ids_the_model_gave_are_kept():
    items = normalize_action([ANSWER, CALL, {"type": "reasoning", "id": "r9", "summary": []}], turn=7)
    assert [item["id"] for item in items] == ["m1", "fc_t7_1", "r9"]
    assert items[1]["call_id"] == "c1"


def test_ids_are_deterministic_per_turn():
    first = normalize_action([{"type": "function_call", "name": "f", "arguments": "{}"}], turn=3)
    assert first == normalize_action([{"type": "function_call", "name": "f", "arguments": "{}"}], turn=3)
    other = normalize_action([{"type": "function_call", "name": "f", "arguments": "{}"}], turn=4)
    assert (first[0]["call_id"], other[0]["call_id"]) == ("call_t3_0", "call_t4_0")


def test_string_arguments_are_kept_as_written():
    written = '{ "city" :"Lima" ,"units":"metric"}'
    [item] = normalize_action([{**CALL, "arguments": written}], turn=0)
    assert item["arguments"] == written


def test_sdk_objects_become_plain_items():
    action = [
        ResponseReasoningItem(id="rs_1", type="reasoning",
                              summary=[Summary(type="summary_text", text="hmm")]),
        ResponseFunctionToolCall(type="function_call", call_id="c1", name="get_weather",
                                 arguments='{"city": "Lima"}'),
        ResponseOutputMessage(id="m1", type="message", role="assistant", status="completed",
                              content=[ResponseOutputText(type="output_text", text="Cold.", annotations=[])]),
    ]
    items = normalize_action(action, turn=0)
    assert all(type(item) is dict for item in items)
    assert [item["type"] for item in items] == ["reasoning", "function_call", "message"]
    assert items[1]["arguments"] == '{"city": "Lima"}' and items[1]["id"] == "fc_t0_1"
    assert items[2]["content"][0]["text"] == "Cold."


def test_a_response_object_or_dict_gives_its_output():
    response = make_response([CALL, ANSWER])
    from_object = normalize_action(response, turn=1)
    assert [item["type"] for item in from_object] == ["function_call", "message"]
    assert from_object[0]["call_id"] == "c1" and from_object[0]["id"] == "fc_t1_0"
    as_dict = response.model_dump(mode="json", exclude_none=True)
    assert normalize_action(as_dict, turn=1) == from_object


# ---- refusals -------------------------------------------------------------------------------

WHAT = "an action is raw model text, a list of Responses output items, or a Response; got "
MODEL_TYPES = "['function_call', 'message', 'reasoning']"


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (42, WHAT + "int"),
        (None, WHAT + "NoneType"),
        ({"type": "message", "role": "assistant", "content": "hi"}, WHAT + "dict"),
        ({"object": "response", "output": "not a list"}, WHAT + "dict"),
        ([CALL, 3], "action item 1 is a int, not a Responses item dict"),
        ([["nested"]], "action item 0 is a list, not a Responses item dict"),
        ([{"type": "function_call_output", "call_id": "x", "output": ""}],
         f"action item 0 has type 'function_call_output'; a model turn holds {MODEL_TYPES} items "
         "(tool outputs come from the environment)"),
        ([{"foo": 1}], f"action item 0 has type None; a model turn holds {MODEL_TYPES} items"),
        ([{"role": "user", "content": "hi"}],
         "action item 0 is a 'user' message; the model speaks as 'assistant'"),
        ([ANSWER, {"type": "message", "role": "system", "content": "x"}],
         "action item 1 is a 'system' message; the model speaks as 'assistant'"),
        ([{"type": "function_call", "name": "f", "arguments": {"x": float("nan")}}],
         "action item 0: arguments are not JSON: Out of range float values are not JSON compliant"),
        ([{"type": "function_call", "name": "f", "arguments": {"x": {1, 2}}}],
         "action item 0: arguments are not JSON: Object of type set is not JSON serializable"),
        ([{"type": "function_call", "name": "f"}], "invalid action item: 0."),
        ([{"type": "function_call", "name": "f", "arguments": 5}], "invalid action item: 0."),
        ([ANSWER, {"type": "reasoning"}], "invalid action item: 1."),
        ("text \ud800", "invalid action: not JSON text: 'utf-8' codec can't encode character '\\ud800'"),
        ([{"type": "message", "content": "a\udfffb"}],
         "invalid action: not JSON text: 'utf-8' codec can't encode"),
        ([{"type": "message", "content": [{"type": "output_text", "text": b"x"}]}],
         "invalid action: not JSON text: Object of type bytes is not JSON serializable"),
    ],
)
def test_refusals_say_what_is_wrong(action: Any, message: str) -> None:
    with pytest.raises(ActionError) as refused:
        normalize_action(action, turn=0)
    assert str(refused.value).startswith(message), str(refused.value)
    assert isinstance(refused.value, NemoGymError) and len(str(refused.value)) <= 1000
