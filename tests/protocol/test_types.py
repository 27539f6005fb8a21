"""The wire types (built on the ``openai`` SDK's models) and ``make_response``: pure functions."""

from __future__ import annotations

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
    """The SDK defers its models' validators; types.py builds ours once, so every model that
    holds a Response (the verify request and reply, each server's subclasses) reuses them."""
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
