"""Responses items <-> chat messages: both directions, and round trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.policies.chat import chat_message_to_items, responses_to_chat_messages, tools_to_chat

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


def call(call_id: str, city: str) -> dict:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": "get_weather",
            "arguments": json.dumps({"city": city})}


def output(call_id: str, text: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def assistant(text: str) -> dict:
    return {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


# ---- Responses -> chat ------------------------------------------------------------------------


def test_input_roles_and_content_parts():
    messages = responses_to_chat_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Sys."}]},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}]},
        ],
        [],
        instructions="Follow the rules.",
    )
    assert messages == [
        {"role": "system", "content": "Follow the rules."},
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Hi there"},
    ]


def test_string_input_is_one_user_message():
    assert responses_to_chat_messages("Hello") == [{"role": "user", "content": "Hello"}]


def test_images_become_image_url_parts():
    [message] = responses_to_chat_messages(
        [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                      {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]}]
    )
    assert message["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]


def test_tool_calls_and_outputs():
    messages = responses_to_chat_messages(
        "Weather in Oslo and Lima?",
        [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Two cities."}]},
            assistant("Looking them up."),
            call("c1", "Oslo"),
            call("c2", "Lima"),
            output("c1", "cold"),
            output("c2", "warm"),
            assistant("Cold in Oslo, warm in Lima."),
        ],
    )
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    first = messages[1]
    assert first["content"] == "<think>\nTwo cities.\n</think>\n\nLooking them up."
    assert first["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}},
    ]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "cold"}
    assert messages[4] == {"role": "assistant", "content": "Cold in Oslo, warm in Lima."}


def test_call_without_text_has_null_content():
    messages = responses_to_chat_messages("q", [call("c1", "Oslo")])
    assert messages[1]["content"] is None


@pytest.mark.parametrize("mode,content,field", [
    ("think", "<think>\nHmm.\n</think>\n\nAnswer.", None),
    ("field", "Answer.", "Hmm."),
    ("drop", "Answer.", None),
])
def test_reasoning_modes(mode, content, field):
    history = [{"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "Hmm."}]}, assistant("Answer.")]
    message = responses_to_chat_messages("q", history, reasoning=mode)[1]
    assert message["content"] == content
    assert message.get("reasoning_content") == field


def test_token_fields_are_ignored():
    item = {**call("c1", "Oslo"), "prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}
    message = responses_to_chat_messages("q", [item])[1]
    assert set(message) == {"role", "content", "tool_calls"}


def test_sdk_objects_are_accepted():
    from openai.types.responses import ResponseFunctionToolCall

    sdk_call = ResponseFunctionToolCall(type="function_call", call_id="c1", name="get_weather", arguments="{}")
    assert responses_to_chat_messages("q", [sdk_call])[1]["tool_calls"][0]["id"] == "c1"


@pytest.mark.parametrize("item,error,match", [
    ({"type": "web_search_call", "id": "ws"}, ValueError, "item 0 has type 'web_search_call'"),
    ({"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}, ValueError, "input_file"),
    ("not an item", TypeError, "not a Responses item"),
])
def test_unrepresentable_items_are_rejected(item, error, match):
    with pytest.raises(error, match=match):
        responses_to_chat_messages([item])


# ---- chat -> Responses ------------------------------------------------------------------------


def test_structured_tool_calls_keep_their_ids():
    items = chat_message_to_items(
        {"role": "assistant", "content": "Let me check.",
         "tool_calls": [{"id": "call_abc", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        "p",
    )
    assert [(i["type"], i["id"]) for i in items] == [("message", "msg_p_0"), ("function_call", "fc_p_1")]
    assert items[1]["call_id"] == "call_abc"
    assert items[1]["arguments"] == '{"city": "Oslo"}'
    assert normalize_action(items, turn=0) == items  # the env takes them as they are


def test_hermes_markup_in_content_becomes_calls():
    items = chat_message_to_items(
        {"role": "assistant", "content": '<think>Need data.</think>\n<tool_call>\n{"name": "get_weather", '
                                         '"arguments": {"city": "Lima"}}\n</tool_call>'},
        "p",
    )
    assert [i["type"] for i in items] == ["reasoning", "function_call"]
    assert items[0]["summary"][0]["text"] == "Need data."
    assert (items[1]["id"], items[1]["call_id"], items[1]["arguments"]) == ("fc_p_1", "call_p_1", '{"city": "Lima"}')


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_fields(key):
    items = chat_message_to_items({"role": "assistant", "content": "42", key: "Multiply."}, "p")
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[0]["summary"] == [{"type": "summary_text", "text": "Multiply."}]


def test_refusal_and_empty_message():
    items = chat_message_to_items({"role": "assistant", "content": None, "refusal": "I can't."}, "p")
    assert items[0]["content"] == [{"type": "refusal", "refusal": "I can't."}]
    assert chat_message_to_items({"role": "assistant", "content": ""}, "p") == []


def test_tool_call_without_id_or_with_dict_arguments():
    [item] = chat_message_to_items(
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}, "p"
    )
    assert (item["call_id"], item["arguments"]) == ("call_p_0", '{"a": 1}')


def test_sdk_chat_message():
    from openai.types.chat import ChatCompletionMessage

    message = ChatCompletionMessage.model_validate(
        {"role": "assistant", "content": "Hi", "reasoning_content": "Greet."}  # vLLM's extra field survives
    )
    assert [i["type"] for i in chat_message_to_items(message, "p")] == ["reasoning", "message"]


# ---- tools -------------------------------------------------------------------------------------


def test_tools_to_chat():
    assert tools_to_chat([WEATHER]) == [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                          "parameters": WEATHER["parameters"], "strict": True}}
    ]
    chat_shaped = {"type": "function", "function": {"name": "x"}}
    assert tools_to_chat([chat_shaped]) == [chat_shaped]
    assert tools_to_chat(None) == []
    with pytest.raises(ValueError, match="web_search"):
        tools_to_chat([{"type": "web_search"}])


# ---- round trips -------------------------------------------------------------------------------

_names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
_texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(lambda t: "<" not in t and t.strip() == t)
_args = st.dictionaries(_names, st.one_of(st.integers(), _texts), max_size=3)


@settings(max_examples=60, deadline=None)
@given(text=_texts, thoughts=_texts, calls=st.lists(st.tuples(_names, _args), max_size=3))
def test_turn_round_trip(text, thoughts, calls):
    """items -> chat message -> items gives the same types, text, calls and call ids."""
    items = chat_message_to_items(
        {"role": "assistant", "content": text or None, "reasoning_content": thoughts or None,
         "tool_calls": [{"id": f"id{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                        for n, (name, args) in enumerate(calls)]},
        "a",
    )
    if not items:  # nothing said: no message to send back
        return
    for mode in ("think", "field"):
        [message] = responses_to_chat_messages([], items, reasoning=mode)
        again = chat_message_to_items(message, "a")
        assert again == items
