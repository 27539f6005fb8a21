"""What a rollout row says the model did (``protocol/outcomes.py``) and why a ``<tool_call>`` is no call: pure functions."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_gym_env.protocol.items import content_text
from nemo_gym_env.protocol.outcomes import OUTCOME_TEXT, TOOL_CALL_ERRORS_KEY, outcome
from nemo_gym_env.protocol.parser import TOOL_OPEN, parse_model_text, render_tool_call, tool_call_problem

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]


def row(reward: float, *output: dict, tools: list | None = None, **fields) -> dict:
    return {"reward": reward, "responses_create_params": {"input": "hi", "tools": TOOLS if tools is None else tools},
            "response": {"output": list(output)}, **fields}


def say(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


CALL = {"type": "function_call", "name": "get_weather", "arguments": "{}", "call_id": "c"}
OUT = {"type": "function_call_output", "call_id": "c", "output": "{}"}


@pytest.mark.parametrize("case,expected", [
    (row(1.0, CALL, OUT, say("Cold.")), "right"),
    (row(1.3, CALL, OUT, say("Cold.")), "right"),                      # above the threshold passes too
    (row(0.0, say("It is probably sunny.")), "no_tool_call"),
    (row(0.0, CALL, OUT, say("Cold.")), "wrong"),
    (row(0.0, say("Cold."), tools=[]), "wrong"),                       # no tools offered: just wrong
    (row(0.5, say("half"), tools=[]), "partly_right"),
    (row(-0.64, say("<guess>3</guess>"), tools=[]), "wrong"),          # a game's negative return
    (row(-0.3, say("<guess>3</guess>"), tools=[], truncated=True), "cut_off"),
    (row(0.0, CALL, OUT), "cut_off"),                             # still calling tools at the limit
    (row(0.0, say("x"), **{TOOL_CALL_ERRORS_KEY: ["Unknown tool 'nosuch'"]}), "bad_tool_call"),
    (row(0.0, say("x"), failure_kind="wrong_answer"), "wrong_answer"),  # the server's own kind
    (row(1.0, say("x"), mask_sample=True), "masked"),
    (row(0.0, say("x"), failure_kind="timeout", **{TOOL_CALL_ERRORS_KEY: ["e"]}), "timeout"),
    ({"reward": "NaN"}, "wrong"),                                      # nothing usable: still one outcome
    ({}, "wrong"),
])
def test_outcome_of_a_row(case, expected):
    assert outcome(case) == expected
    assert OUTCOME_TEXT.get(expected, expected)


FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JSONISH = st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                           st.sampled_from(["output", "tools", "type", "name"]), inner, max_size=3),
                       max_leaves=6)


@FAST
@given(st.dictionaries(st.sampled_from(["reward", "response", "responses_create_params", "failure_kind",
                                        "mask_sample", TOOL_CALL_ERRORS_KEY, "truncated"]), JSONISH))
def test_any_row_has_an_outcome(value):
    assert isinstance(outcome(value), str) and outcome(value)


@pytest.mark.parametrize("text,problem", [
    ('<tool_call>{city: 1}</tool_call>', "is not JSON (Expecting property name enclosed in double quotes at column 2)"),
    ('<tool_call>{"name": "f", "arguments": {}', "without its </tool_call>"),
    ('<tool_call>["f"]</tool_call>', 'not a JSON object with a string "name"'),
    ('<tool_call>{"arguments": {}}</tool_call>', 'not a JSON object with a string "name"'),
    ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not"),
])
def test_why_a_tool_call_block_is_not_a_call(text, problem):
    found = tool_call_problem(text)
    assert found is not None and problem in found and len(found) < 400


@FAST
@given(st.text(max_size=60), st.sampled_from(["{city: 1}", '{"name": 1}', "", "{", '{"name": "f"']))
def test_every_tool_call_the_parser_leaves_as_text_has_a_reason(prefix, body):
    """What the parser leaves in a message's text is exactly what gets a reason: a well-formed call never does."""
    text = prefix + TOOL_OPEN + body + "</tool_call>"
    messages = [i for i in parse_model_text(text) if i["type"] == "message"]
    left = content_text(messages[0]["content"]) if messages else ""
    assert (tool_call_problem(left) is not None) == (TOOL_OPEN in left)
    good = parse_model_text(prefix.replace("<", "") + render_tool_call("f", {"a": 1}))
    assert all(tool_call_problem(content_text(i["content"])) is None for i in good if i["type"] == "message")
    assert json.loads(next(i for i in good if i["type"] == "function_call")["arguments"]) == {"a": 1}
