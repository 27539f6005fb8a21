"""The wire types and ``make_response``: pure functions; their JSON agrees with the ``openai`` SDK's models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from nemo_gym_env.protocol.types import (
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    FunctionCall,
    FunctionCallForTraining,
    FunctionCallOutput,
    InputMessage,
    OutputMessage,
    ReasoningItem,
    make_response,
)

ITEMS = [
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "{}"},
    {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "hi", "annotations": []}]},
]


def test_response_output_items_get_their_types():
    response = make_response(ITEMS)
    assert [type(i) for i in response.output] == [ReasoningItem, FunctionCall, FunctionCallOutput, OutputMessage]
    again = make_response(response.model_dump(mode="json", by_alias=True)["output"])
    assert again.output == response.output


def test_training_token_fields_select_the_training_variant():
    item = {**ITEMS[1], "prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}
    parsed = make_response([item]).output[0]
    assert isinstance(parsed, FunctionCallForTraining) and parsed.generation_token_ids == [3]


def test_run_request_keeps_ground_truth_and_unknown_create_params_and_checks_known_ones():
    row = {"responses_create_params": {"input": [{"role": "user", "content": "q"}]}, "expected_answer": "4"}
    request = BaseRunRequest.model_validate(row)
    assert isinstance(request.responses_create_params.input[0], InputMessage)
    assert request.model_dump()["expected_answer"] == "4"
    # NeMo Gym 0.7's agent adds keys 0.4's did not: they are kept and passed on, whatever they are.
    newer = {"input": "q", "context_management": None, "prompt_cache_key": None, "stream_options": None,
             "future_key": {"x": 1}}
    dumped = BaseRunRequest.model_validate({"responses_create_params": newer}).model_dump()
    assert dumped["responses_create_params"]["future_key"] == {"x": 1} and "stream_options" in dumped[
        "responses_create_params"]
    with pytest.raises(ValidationError, match="temperature"):  # a field we read is still checked
        BaseRunRequest.model_validate({"responses_create_params": {"input": "q", "temperature": "warm"}})


def test_verify_response_echoes_the_request():
    request = BaseVerifyRequest.model_validate({"responses_create_params": {"input": "q"}, "response":
                                                make_response(ITEMS).model_dump(), "gt": 1})
    reply = BaseVerifyResponse(**request.model_dump(), reward=1.0)
    dumped = reply.model_dump(mode="json")
    assert dumped["gt"] == 1 and dumped["reward"] == 1.0 and dumped["response"]["object"] == "response"


def test_response_models_are_built_at_import_so_requests_reuse_them():
    """Every model that holds a Response (the verify request and reply, each server's subclasses)
    reuses the item models' validators, built once at import."""
    from nemo_gym_env.protocol import types

    for model in (types.Response, types.FunctionCall, types.OutputMessage, types.ReasoningItem,
                  types.InputMessage, types.FunctionCallForTraining, types.ResponseUsage):
        assert model.__pydantic_complete__, model.__name__

    class MyVerifyRequest(types.BaseVerifyRequest):
        expected: str

    assert MyVerifyRequest.__pydantic_complete__
    row = {"responses_create_params": {"input": "hi"}, "expected": "x",
           "response": types.make_response([{"type": "function_call", "call_id": "c", "name": "f",
                                             "arguments": "{}"}]).model_dump()}
    assert isinstance(MyVerifyRequest.model_validate(row).response.output[0], types.FunctionCall)


# ---- the same JSON as the ``openai`` SDK's models -------------------------------------------

USAGE = {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17,
         "input_tokens_details": {"cached_tokens": 3}, "output_tokens_details": {"reasoning_tokens": 1}}
TOOLS = [{"type": "function", "name": "f", "description": "d", "strict": True,
          "parameters": {"type": "object", "properties": {}}}]


def _sdk_json(model) -> dict:
    return model.model_dump(mode="json", exclude_none=True, by_alias=True)


def test_our_response_is_a_valid_sdk_response_with_the_same_json():
    from openai.types.responses import Response as SDKResponse

    ours = make_response([item for item in ITEMS if item["type"] != "function_call_output"], tools=TOOLS,
                         usage=USAGE, temperature=0.5, status="completed")
    theirs = SDKResponse.model_validate(ours.model_dump(mode="json"))
    assert _sdk_json(theirs) == _sdk_json(ours)
    assert theirs.usage.input_tokens_details.cached_tokens == 3 and theirs.output[1].call_id == "c1"


def test_an_sdk_response_travels_through_ours_unchanged_unknown_fields_included():
    from openai.types.responses import Response as SDKResponse

    sdk = SDKResponse.model_validate({**make_response(ITEMS[:2], tools=TOOLS).model_dump(mode="json"),
                                      "usage": {**USAGE, "input_tokens_details": {"cached_tokens": 3,
                                                                                  "cache_write_tokens": 0}},
                                      "prompt_cache_key": "k", "safety_identifier": "s", "a_future_field": [1]})
    sent = _sdk_json(sdk)
    assert make_response(sent["output"], **{k: v for k, v in sent.items() if k != "output"}).model_dump(
        mode="json", exclude_none=True) == sent


@pytest.mark.parametrize("tool,error", [
    ({"type": "function"}, "name"),
    ({"type": "function", "name": "f", "parameters": "not a schema"}, "parameters"),
    ({"name": "f"}, "type"),
])
def test_a_tool_missing_what_is_read_is_refused(tool, error):
    with pytest.raises(ValidationError, match=error):
        BaseRunRequest.model_validate({"responses_create_params": {"input": "q", "tools": [tool]}})
    hosted = {"type": "web_search", "search_context_size": "low"}  # another kind of tool is kept as it came
    assert BaseRunRequest.model_validate({"responses_create_params": {"input": "q", "tools": [hosted]}}).model_dump(
        mode="json")["responses_create_params"]["tools"] == [hosted]


def test_a_server_process_never_imports_the_openai_sdk():
    """The wire types are this package's own: a server (and the env) start without the SDK's ~0.6 s import."""
    script = ("import sys, servers.example_multi_step.app, nemo_gym_env.envs.env; "
              "assert 'openai' not in sys.modules, sorted(m for m in sys.modules if m.startswith('openai'))[:5]")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
