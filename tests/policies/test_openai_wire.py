"""OpenAIPolicy's plain-JSON wire agrees with the ``openai`` SDK: the bodies it sends and the items it reads.

Bodies: the SDK sends the same request to the same server process (tests/fixtures/openai_server.py),
and the two bodies that arrive are compared. Replies: the SDK's models parse the same reply, and
every item the policy reads is compared with the SDK's reading, item type by item type.
"""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseInputItem
from pydantic import TypeAdapter

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.policies import OpenAIPolicy, PolicyRequest
from nemo_gym_env.policies.openai_compat import chat_token_data, reply_usage

TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city.", "strict": False,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HISTORY = [
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look it up."}]},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": '{"city": "Oslo"}', "status": "completed",
     "prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.1]},
    {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 3}'},
    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "It is 3 degrees.", "annotations": []}]},
    {"type": "message", "role": "user", "content": "And in Bergen?"},
]
REQUEST = PolicyRequest(
    input=[{"role": "system", "content": "You answer weather questions."},
           {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}],
    history=HISTORY, tools=[TOOL],
    sampling={"temperature": 0.7, "top_p": 0.9, "max_output_tokens": 64, "parallel_tool_calls": False,
              "tool_choice": {"type": "function", "name": "get_weather"}, "instructions": "Be brief."},
)
SDK_REQUEST_KEYS = {"model", "input", "tools", "temperature", "top_p", "max_output_tokens", "parallel_tool_calls",
                    "tool_choice", "instructions", "messages", "max_completion_tokens", "logprobs"}


def tag(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def last_body(base_url: str, model: str) -> dict:
    return httpx.get(f"{base_url}/_last/{model}").json()


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_body_is_what_the_sdk_sends(openai_base_url, api):
    """Our body, handed to the SDK as arguments, reaches the server byte-for-byte equal as JSON."""
    ours, theirs = tag("scripted"), tag("scripted")
    policy = OpenAIPolicy(ours, base_url=openai_base_url, api=api, token_data=True, extra_body={"seed": 7})
    background_loop().run(policy.generate(REQUEST))
    sent = last_body(openai_base_url, ours)
    body = policy.chat_body(REQUEST) if api == "chat" else policy.responses_body(REQUEST)
    assert sent == body  # what we build is what arrives

    known = {k: v for k, v in body.items() if k in SDK_REQUEST_KEYS}
    extra = {k: v for k, v in body.items() if k not in SDK_REQUEST_KEYS}
    assert extra == ({"seed": 7, "return_token_ids": True} if api == "chat" else {"seed": 7})
    client = openai.OpenAI(base_url=openai_base_url, api_key="EMPTY", max_retries=0)
    try:
        create = client.chat.completions.create if api == "chat" else client.responses.create
        create(**{**known, "model": theirs}, extra_body=extra)
    finally:
        client.close()
    assert last_body(openai_base_url, theirs) == {**sent, "model": theirs}


def test_responses_input_items_are_sdk_input_items():
    """Every item of a Responses ``input`` validates as the SDK's ``ResponseInputItem`` and loses nothing."""
    body = OpenAIPolicy("m", base_url="http://127.0.0.1:9/v1").responses_body(REQUEST)
    adapter = TypeAdapter(ResponseInputItem)
    for item in body["input"]:
        parsed = adapter.validate_python(item)
        assert parsed.model_dump(mode="json", exclude_unset=True) == item
        assert not any(k in item for k in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"))


RESPONSES_REPLY = {
    "id": "resp_1", "object": "response", "created_at": 1.0, "model": "m", "status": "completed",
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
    "output": [
        {"type": "reasoning", "id": "rs_9", "summary": [{"type": "summary_text", "text": "Hmm."}],
         "content": [{"type": "reasoning_text", "text": "Thinking hard."}]},
        {"type": "function_call", "id": "fc_9", "call_id": "call_9", "name": "get_weather",
         "arguments": '{"city": "Bergen"}', "status": "completed"},
        {"type": "message", "id": "msg_9", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Rain.", "annotations": [], "logprobs": []}],
         "prompt_token_ids": [5, 6], "generation_token_ids": [7, 8], "generation_log_probs": [-0.5, -0.25]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "rain"}},
    ],
    "usage": {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 9,
              "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 49},
}


def test_responses_items_agree_with_the_sdk():
    policy = OpenAIPolicy("m", base_url="http://127.0.0.1:9/v1")
    turn = policy.parse_responses(RESPONSES_REPLY)
    sdk = SDKResponse.model_validate(RESPONSES_REPLY)
    actions = [o for o in sdk.output if o.type in ("message", "function_call", "reasoning")]
    assert [i["type"] for i in turn.items] == [o.type for o in actions] == ["reasoning", "function_call", "message"]
    adapter = TypeAdapter(type(sdk).model_fields["output"].annotation)
    for ours, theirs in zip(turn.items, actions):
        theirs_dump = {k: v for k, v in theirs.model_dump(mode="json", exclude_none=True).items()
                       if k not in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")}
        assert adapter.validate_python([ours])[0].model_dump(mode="json", exclude_none=True) == theirs_dump
    text = sdk.output_text
    assert turn.items[2]["content"][0]["text"] == text == "Rain."
    assert (turn.prompt_token_ids, turn.generation_token_ids, turn.generation_log_probs) == ([5, 6], [7, 8], [-0.5, -0.25])
    assert (turn.input_tokens, turn.output_tokens) == (sdk.usage.input_tokens, sdk.usage.output_tokens)


CHAT_REPLY = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "prompt_token_ids": [1, 2, 3],
    "choices": [{
        "index": 0, "finish_reason": "tool_calls", "token_ids": [4, 5],
        "logprobs": {"content": [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []},
                                 {"token": "b", "logprob": -0.2, "bytes": [98], "top_logprobs": []}]},
        "message": {"role": "assistant", "content": "Let me check.", "reasoning_content": "Weather tool.",
                    "tool_calls": [{"id": "call_a", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                                   {"id": "call_b", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}}]},
    }],
    "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42},
}


def test_chat_items_agree_with_the_sdk():
    policy = OpenAIPolicy("m", base_url="http://127.0.0.1:9/v1", api="chat")
    turn = policy.parse_chat(CHAT_REPLY)
    sdk = ChatCompletion.model_validate(CHAT_REPLY)
    message = sdk.choices[0].message
    by_type: dict[str, list[dict]] = {}
    for item in turn.items:
        by_type.setdefault(item["type"], []).append(item)
    assert [i["summary"][0]["text"] if i.get("summary") else i["content"][0]["text"] for i in by_type["reasoning"]] \
        == [message.model_extra["reasoning_content"]]
    assert [c["text"] for m in by_type["message"] for c in m["content"] if c["type"] == "output_text"] == [message.content]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in by_type["function_call"]] == \
        [(t.id, t.function.name, t.function.arguments) for t in message.tool_calls]
    assert turn.generation_log_probs == [c.logprob for c in sdk.choices[0].logprobs.content]
    assert (turn.prompt_token_ids, turn.generation_token_ids) == tuple(chat_token_data(CHAT_REPLY)[:2]) == ([1, 2, 3], [4, 5])
    assert (turn.input_tokens, turn.output_tokens) == (sdk.usage.prompt_tokens, sdk.usage.completion_tokens)


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("knob", ["scripted", "think"])
def test_live_replies_agree_with_the_sdk(openai_base_url, api, knob):
    """Replies of the server process, read by us and by the SDK from the same bytes."""
    policy = OpenAIPolicy(tag(knob), base_url=openai_base_url, api=api, token_data=True)
    request = PolicyRequest(input=[{"role": "user", "content": "Weather in Oslo?"}], history=[], tools=[TOOL])
    body = policy.chat_body(request) if api == "chat" else policy.responses_body(request)
    raw = httpx.post(f"{openai_base_url}/{'chat/completions' if api == 'chat' else 'responses'}", json=body).json()
    if api == "chat":
        turn, sdk = policy.parse_chat(raw), ChatCompletion.model_validate(raw)
        assert [i["name"] for i in turn.items if i["type"] == "function_call"] == \
            [t.function.name for t in sdk.choices[0].message.tool_calls]
        assert (turn.input_tokens, turn.output_tokens) == (sdk.usage.prompt_tokens, sdk.usage.completion_tokens)
        assert turn.output_tokens == len(turn.generation_token_ids)
    else:
        turn, sdk = policy.parse_responses(raw), SDKResponse.model_validate(raw)
        adapter = TypeAdapter(type(sdk).model_fields["output"].annotation)
        assert adapter.validate_python(turn.items) == sdk.output
        assert reply_usage(raw) == {"input_tokens": turn.input_tokens, "output_tokens": turn.output_tokens} == {
            "input_tokens": sdk.usage.input_tokens, "output_tokens": sdk.usage.output_tokens}
