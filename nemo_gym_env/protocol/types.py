"""Wire types shared by servers, client, env and adapters.

The item and response models subclass the ``openai`` SDK's ``openai.types.responses``
models, with the same field names NeMo Gym uses, so a NeMo Gym resources server ports by
changing its imports::

    from nemo_gym_env.server import BaseVerifyRequest, BaseVerifyResponse

    class MyVerifyRequest(BaseVerifyRequest):
        expected_answer: str

The request models validate the fields they read and keep every other key: unknown keys of
``responses_create_params`` (what a newer client sends) and extra top-level row fields (the
ground truth datasets carry) are passed on and echoed back by ``/verify``.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Literal, TypeAlias, Union

from openai.types.responses import (
    EasyInputMessage,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses import (
    Response as _OpenAIResponse,
)
from openai.types.responses.response_create_params import (
    Reasoning,
    ResponseIncludable,
    ResponseTextConfigParam,
    ToolChoice,
    ToolParam,
)
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import (
    InputTokensDetails as _InputTokensDetails,
)
from openai.types.responses.response_usage import (
    ResponseUsage as _ResponseUsage,
)
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "TokenIdsMixin",
    "InputMessage",
    "Message",
    "OutputText",
    "OutputMessage",
    "FunctionCall",
    "FunctionCallOutput",
    "ReasoningItem",
    "SummaryText",
    "InputItem",
    "OutputItem",
    "Response",
    "ResponseUsage",
    "InputTokensDetails",
    "ResponsesCreateParams",
    "BaseRunRequest",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "AggregateMetricsRequest",
    "AggregateMetrics",
    "RELEASES_SESSION",
    "RESERVED_ROUTES",
    "TOOL_NAME_RE",
    "new_id",
    "make_response",
]


RESERVED_ROUTES = frozenset({"seed_session", "verify", "aggregate_metrics", "close_session", "reverify_mode", "mcp",
                             "openapi.json", "docs", "redoc"})
"""Route names of a resources server that are not tools."""

RELEASES_SESSION = "x-releases-session"
"""OpenAPI extension on a server's ``/verify``: the server frees the session's state there, so a
client need not send NeMo Gym 0.7's ``POST /close_session`` after it."""

TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
"""What a tool route name may look like; anything else never reaches a URL."""


def new_id(prefix: str) -> str:
    """A fresh random item id such as ``fc_3f2a...``; the Responses API's id shape."""
    return f"{prefix}_{uuid.uuid4().hex}"


class TokenIdsMixin(BaseModel):
    """Training token data NeMo Gym attaches to the last output item of each model call.

    Invariant (NeMo RL asserts it): each call's ``prompt_token_ids`` starts with every token
    seen so far, prompt and generations alike.
    """

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


class SummaryText(Summary):
    """One ``summary_text`` part of a reasoning item."""


class OutputText(ResponseOutputText):
    """Text content of an assistant message; ``annotations`` defaults to empty."""

    annotations: list[Any] = Field(default_factory=list)  # type: ignore[assignment]
    type: Literal["output_text"] = "output_text"


class OutputMessage(ResponseOutputMessage):
    """An assistant message the model produced."""

    content: list[Union[OutputText, ResponseOutputRefusal]]  # type: ignore[assignment]
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    type: Literal["message"] = "message"


class InputMessage(EasyInputMessage):
    """A message given to the model (``role`` user/system/developer/assistant, text content)."""

    type: Literal["message"] = "message"  # type: ignore[assignment]


class Message(BaseModel):
    """An input message whose content is a list of parts (``input_text`` and friends)."""

    content: list[dict[str, Any]]
    role: Literal["user", "system", "developer"]
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    type: Literal["message"] = "message"


class FunctionCall(ResponseFunctionToolCall):
    """A tool call: ``arguments`` is the JSON string the model wrote, valid or not."""

    type: Literal["function_call"] = "function_call"


class FunctionCallOutput(BaseModel):
    """What the environment answered to the call with the same ``call_id``."""

    call_id: str
    output: str
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ReasoningItem(ResponseReasoningItem):
    """Model reasoning, e.g. a ``<think>`` block, as ``summary_text`` parts."""

    summary: list[SummaryText]  # type: ignore[assignment]
    type: Literal["reasoning"] = "reasoning"


class OutputMessageForTraining(OutputMessage, TokenIdsMixin):
    """:class:`OutputMessage` carrying the model call's token ids and log-probs."""


class FunctionCallForTraining(FunctionCall, TokenIdsMixin):
    """:class:`FunctionCall` carrying the model call's token ids and log-probs."""


class ReasoningItemForTraining(ReasoningItem, TokenIdsMixin):
    """:class:`ReasoningItem` carrying the model call's token ids and log-probs."""


# Training variants first: pydantic's smart union prefers the model that uses more fields.
InputItem: TypeAlias = Union[
    OutputMessageForTraining,
    FunctionCallForTraining,
    ReasoningItemForTraining,
    InputMessage,
    Message,
    OutputMessage,
    FunctionCall,
    FunctionCallOutput,
    ReasoningItem,
]
OutputItem: TypeAlias = InputItem


class InputTokensDetails(_InputTokensDetails):
    """``usage.input_tokens_details``; counts that newer ``openai`` SDKs require default to 0.

    NeMo Gym pins ``openai<=2.7.2``, whose usage has no ``cache_write_tokens``: without the
    default, every ``/verify`` from its agent (whose model server reports usage) would be a 422.
    """

    cached_tokens: int = 0
    if "cache_write_tokens" in _InputTokensDetails.model_fields:
        cache_write_tokens: int = 0


class ResponseUsage(_ResponseUsage):
    """``Response.usage``, accepting the usage older SDKs and model servers write."""

    input_tokens_details: InputTokensDetails  # type: ignore[assignment]


class Response(_OpenAIResponse):
    """A Responses-API ``Response`` whose ``output`` holds every item of an episode."""

    output: list[OutputItem]  # type: ignore[assignment]
    usage: ResponseUsage | None = None  # type: ignore[assignment]


# The ``openai`` SDK defers building its models' validators to first use, and ours inherit that.
# Built here, leaves first, so every model that refers to them (the run and verify requests
# below, each server's subclasses of those) reuses their validators instead of generating the
# whole Response schema again inline: ~50 ms per such model otherwise.
for _model in (OutputText, SummaryText, OutputMessage, InputMessage, FunctionCall, ReasoningItem,
               OutputMessageForTraining, FunctionCallForTraining, ReasoningItemForTraining,
               InputTokensDetails, ResponseUsage, Response):
    _model.model_rebuild()
del _model


def make_response(
    output: list[Any],
    *,
    tools: list[Any] | None = None,
    model: str = "nemo-gym-env",
    response_id: str | None = None,
    **fields: Any,
) -> Response:
    """Build a minimal valid :class:`Response` around episode ``output`` items.

    Example:
        >>> r = make_response([{"type": "message", "id": "msg_1", "role": "assistant",
        ...     "status": "completed", "content": [{"type": "output_text", "text": "hi"}]}])
        >>> r.output[0].content[0].text
        'hi'
    """
    body: dict[str, Any] = {
        "id": response_id or new_id("resp"),
        "created_at": float(int(time.time())),
        "model": model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": tools or [],
    }
    body.update(fields)
    return Response.model_validate(body)


class ResponsesCreateParams(BaseModel):
    """A Responses ``create`` body (non-streaming), validated server-side.

    The fields read here are validated; any other key is kept and passed on unchanged (echoed
    by ``/verify``, sent to the model), so a newer client's keys never make a body invalid:
    NeMo Gym 0.7's agent sends seven keys 0.4's did not (``context_management``,
    ``conversation``, ``moderation``, ``prompt_cache_key``, ``prompt_cache_retention``,
    ``safety_identifier``, ``stream_options``), and the next version will send others.
    """

    model_config = ConfigDict(extra="allow")

    background: bool | None = None
    include: list[ResponseIncludable] | None = None
    input: Union[str, list[InputItem]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: Reasoning | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    store: bool | None = None
    temperature: float | None = None
    text: ResponseTextConfigParam | None = None
    tool_choice: ToolChoice = "auto"
    tools: list[ToolParam] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    stream: Literal[False] | None = None


class BaseRunRequest(BaseModel):
    """A dataset row as sent to ``/seed_session`` or a run: ``responses_create_params`` plus ground truth.

    Extra top-level fields are allowed and kept, so a row's ground truth reaches ``/verify``
    even when the subclass does not declare it.
    """

    model_config = ConfigDict(extra="allow")

    responses_create_params: ResponsesCreateParams


class BaseVerifyRequest(BaseRunRequest):
    """The row plus the finished episode as a :class:`Response`."""

    response: Response


class BaseVerifyResponse(BaseVerifyRequest):
    """The verify request echoed back with ``reward`` and any metrics.

    Optional fields recognised by trainers: ``reward_components`` (summing to ``reward``),
    ``mask_sample``, ``failure_kind``, ``failure_reason``.
    """

    reward: float


class BaseSeedSessionRequest(BaseModel):
    """Body of ``/seed_session``: the whole dataset row (extra fields allowed)."""

    model_config = ConfigDict(extra="allow")


class BaseSeedSessionResponse(BaseModel):
    """Reply of ``/seed_session``; ``{}`` unless a server adds fields."""

    model_config = ConfigDict(extra="allow")


class AggregateMetricsRequest(BaseModel):
    """Body of ``/aggregate_metrics``: verify replies, each with ``reward`` and ideally ``_ng_task_index``."""

    verify_responses: list[dict[str, Any]]


class AggregateMetrics(BaseModel):
    """Reply of ``/aggregate_metrics``: flat metric dicts ready for a logger."""

    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)
