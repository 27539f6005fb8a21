"""Wire types shared by servers, client, env and adapters.

The item and response models have the field names of the ``openai`` SDK's
``openai.types.responses`` models, which NeMo Gym's subclass, so a NeMo Gym resources server
ports by changing its imports::

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
from typing import Annotated, Any, Literal, TypeAlias, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

__all__ = [
    "WireModel",
    "TokenIdsMixin",
    "InputMessage",
    "Message",
    "OutputText",
    "OutputRefusal",
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
    "OutputTokensDetails",
    "FunctionTool",
    "OtherTool",
    "Tool",
    "ToolChoice",
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


class WireModel(BaseModel):
    """Base of the Responses-API models: the fields a reader relies on are validated, any other key is kept.

    A key a newer client or model server adds travels on unchanged, as in the ``openai`` SDK's
    own models (whose field names these share); the schema is this package's own, so it is the
    same whichever SDK version is installed.
    """

    model_config = ConfigDict(extra="allow")


class TokenIdsMixin(BaseModel):
    """Training token data NeMo Gym attaches to the last output item of each model call.

    Invariant (NeMo RL asserts it): each call's ``prompt_token_ids`` starts with every token
    seen so far, prompt and generations alike.
    """

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


Status: TypeAlias = Literal["in_progress", "completed", "incomplete"]


class SummaryText(WireModel):
    """One ``summary_text`` part of a reasoning item."""

    text: str
    type: Literal["summary_text"] = "summary_text"


class OutputText(WireModel):
    """Text content of an assistant message; ``annotations`` defaults to empty."""

    annotations: list[Any] = Field(default_factory=list)
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: list[dict[str, Any]] | None = None


class OutputRefusal(WireModel):
    """A refusal in place of an assistant message's text."""

    refusal: str
    type: Literal["refusal"] = "refusal"


def _part_type(value: Any) -> str | None:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


OutputContent: TypeAlias = Annotated[
    Union[Annotated[OutputText, Tag("output_text")], Annotated[OutputRefusal, Tag("refusal")]],
    Discriminator(_part_type),
]


class OutputMessage(WireModel):
    """An assistant message the model produced."""

    id: str
    content: list[OutputContent]
    role: Literal["assistant"] = "assistant"
    status: Status = "completed"
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = None


class InputMessage(WireModel):
    """A message given to the model (``role`` user/system/developer/assistant, text content).

    ``content`` is a string or a list of content parts (``input_text``, ``input_image``, ...,
    each a ``type``-tagged object).
    """

    content: Union[str, list[dict[str, Any]]]
    role: Literal["user", "assistant", "system", "developer"]
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = None


class Message(BaseModel):
    """An input message whose content is a list of parts (``input_text`` and friends)."""

    content: list[dict[str, Any]]
    role: Literal["user", "system", "developer"]
    status: Status = "completed"
    type: Literal["message"] = "message"


class FunctionCall(WireModel):
    """A tool call: ``arguments`` is the JSON string the model wrote, valid or not."""

    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: str | None = None
    status: Status | None = None


class FunctionCallOutput(BaseModel):
    """What the environment answered to the call with the same ``call_id``."""

    call_id: str
    output: str
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: Status | None = None


class ReasoningItem(WireModel):
    """Model reasoning, e.g. a ``<think>`` block, as ``summary_text`` parts."""

    id: str
    summary: list[SummaryText]
    type: Literal["reasoning"] = "reasoning"
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


class OutputMessageForTraining(OutputMessage, TokenIdsMixin):
    """:class:`OutputMessage` carrying the model call's token ids and log-probs."""


class FunctionCallForTraining(FunctionCall, TokenIdsMixin):
    """:class:`FunctionCall` carrying the model call's token ids and log-probs."""


class ReasoningItemForTraining(ReasoningItem, TokenIdsMixin):
    """:class:`ReasoningItem` carrying the model call's token ids and log-probs."""


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return kind if kind in ("message", "function_call", "reasoning", "function_call_output") else "other"


# Within each kind, training variants first: pydantic's smart union prefers the model that uses more
# fields. An item is tried only against the models of its own ``type`` (a message without one is a
# message): the others refuse it on their ``type`` anyway, so the choice is the same as trying every
# model, at a third of the cost.
_ANY_ITEM: TypeAlias = Union[
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
InputItem: TypeAlias = Annotated[
    Union[
        Annotated[Union[OutputMessageForTraining, InputMessage, Message, OutputMessage], Tag("message")],
        Annotated[Union[FunctionCallForTraining, FunctionCall], Tag("function_call")],
        Annotated[Union[ReasoningItemForTraining, ReasoningItem], Tag("reasoning")],
        Annotated[FunctionCallOutput, Tag("function_call_output")],
        Annotated[_ANY_ITEM, Tag("other")],  # an unknown type: every model refuses it, each saying why
    ],
    Discriminator(_item_kind),
]
OutputItem: TypeAlias = InputItem


class FunctionTool(WireModel):
    """A function the model may call: ``name``, and a JSON schema of its arguments in ``parameters``."""

    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    type: Literal["function"] = "function"
    description: str | None = None


class OtherTool(WireModel):
    """A tool of another ``type`` (a hosted tool such as ``web_search``): kept as it came."""

    type: str


Tool: TypeAlias = Annotated[
    Union[Annotated[FunctionTool, Tag("function")], Annotated[OtherTool, Tag("other")]],
    Discriminator(lambda value: "function" if _part_type(value) == "function" else "other"),
]
"""One entry of ``tools``: a function tool validated as one, any other type kept as it is."""

ToolChoice: TypeAlias = Union[Literal["none", "auto", "required"], dict[str, Any]]
"""``tool_choice``: a mode, or an object naming a tool (``{"type": "function", "name": ...}``)."""


class InputTokensDetails(WireModel):
    """``usage.input_tokens_details``; counts that newer ``openai`` SDKs require default to 0.

    NeMo Gym pins ``openai<=2.7.2``, whose usage has no ``cache_write_tokens``: a usage it
    reports without one is valid here.
    """

    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(WireModel):
    """``usage.output_tokens_details``."""

    reasoning_tokens: int = 0


class ResponseUsage(WireModel):
    """``Response.usage``, accepting the usage older SDKs and model servers write."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class Response(WireModel):
    """A Responses-API ``Response`` whose ``output`` holds every item of an episode.

    The fields the Responses API requires are required; the optional ones this package or a
    trainer reads are typed, and every other key a model server writes is kept.
    """

    id: str
    created_at: float
    model: str
    object: Literal["response"] = "response"
    output: list[OutputItem]
    parallel_tool_calls: bool
    tool_choice: ToolChoice
    tools: list[Tool]
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: Union[str, list[Any], None] = None
    metadata: dict[str, str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"] | None = None
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    usage: ResponseUsage | None = None
    user: str | None = None


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
    include: list[str] | None = None
    input: Union[str, list[InputItem]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    store: bool | None = None
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: ToolChoice = "auto"
    tools: list[Tool] = Field(default_factory=list)
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
