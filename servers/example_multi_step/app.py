"""``example_multi_step``: look up synonym values, then submit them in the right order.

The system prompt lists term -> synonym pairs; the user query is about one of the terms.
The model should call ``get_synonym_value`` for every synonym of that term, then submit the
values with ``extract_synonym_values`` in the order the synonyms appear in the list.

Tools:
    ``POST /get_synonym_value`` ``{"synonym": str}`` -> ``{"synonym_value": int}``
    (the sum of the code points of the synonym's characters).
    ``POST /extract_synonym_values`` ``{"synonym_values": [int, ...]}`` -> ``{"success": true}``.

Step reward (the ``x-nemo-gym-step-reward`` reply header; the tool output is unchanged):
``get_synonym_value`` gives ``config.lookup_step_reward`` (0.1) the first time the episode looks a
synonym up, 0.0 for a repeat. The episode's reward stays the ``/verify`` reward below unless the
client asks for the sum (``episode_reward="sum"``).

Reward: the arguments of the *last* ``extract_synonym_values`` call in the episode are the
answer; ``reward = 1.0`` when its ``synonym_values`` equal the row's
``expected_synonym_values`` exactly (same values, same order), else 0.0. No such call,
arguments that are not JSON, or a missing or non-integer-list ``synonym_values`` count as
the answer ``[]``. Metrics: ``parsed_synonym_values``, ``accuracy``, ``set_overlap``,
``original_term_minefield_hit``, ``order_instruction_following_failure``.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field, StrictInt, TypeAdapter, ValidationError

from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
    set_step_reward,
)

__all__ = [
    "ExampleMultiStepResourcesServer",
    "ExampleMultiStepResourcesServerConfig",
    "ExampleMultiStepRunRequest",
    "ExampleMultiStepVerifyRequest",
    "ExampleMultiStepVerifyResponse",
    "ExtractSynonymValuesRequest",
    "ExtractSynonymValuesResponse",
    "GetSynonymValueRequest",
    "GetSynonymValueResponse",
    "last_extracted_values",
    "synonym_value",
]

EXTRACT_TOOL = "extract_synonym_values"

_INT_LIST = TypeAdapter(list[StrictInt])


def synonym_value(synonym: str) -> int:
    """The value of a synonym: the sum of its characters' code points (``"Wee"`` -> 290)."""
    return sum(map(ord, synonym))


class ExampleMultiStepResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the multi-step server.

    Attributes:
        lookup_step_reward: The step reward of a synonym's first lookup in an episode (0 turns
            step rewards off: no header is sent).
    """

    lookup_step_reward: float = 0.1


class GetSynonymValueRequest(BaseModel):
    """Arguments of ``get_synonym_value``."""

    synonym: str


class GetSynonymValueResponse(BaseModel):
    """Reply of ``get_synonym_value``."""

    synonym_value: int


class ExtractSynonymValuesRequest(BaseModel):
    """Arguments of ``extract_synonym_values``: JSON integers only (no strings, floats or booleans)."""

    synonym_values: list[StrictInt]


class ExtractSynonymValuesResponse(BaseModel):
    """Reply of ``extract_synonym_values``."""

    success: bool


class ExampleMultiStepRunRequest(BaseRunRequest):
    """A dataset row: the prompt plus the ground truth the verifier reads."""

    id: int
    expected_synonyms: list[str]
    expected_synonym_values: list[int]
    minefield_label: str
    minefield_label_value: int


class ExampleMultiStepVerifyRequest(ExampleMultiStepRunRequest, BaseVerifyRequest):
    """The row plus the finished episode."""


class ExampleMultiStepVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the metrics.

    Attributes:
        parsed_synonym_values: The submitted answer (``[]`` when there is none or it is malformed).
        accuracy: Whether the answer equals ``expected_synonym_values`` (values and order).
        set_overlap: Share of the expected values present in the answer, order ignored.
        original_term_minefield_hit: Whether the answer holds the value of the term itself
            (``minefield_label_value``) rather than only its synonyms'.
        order_instruction_following_failure: Every expected value is there but the answer is
            still wrong (wrong order, repeats or extra values).
    """

    parsed_synonym_values: list[int]
    accuracy: bool
    set_overlap: float
    original_term_minefield_hit: bool
    order_instruction_following_failure: bool


def last_extracted_values(output: list[Any]) -> list[int]:
    """``synonym_values`` of the last ``extract_synonym_values`` call in ``output``.

    ``[]`` when there is no such call or its arguments are unusable (not JSON, not an
    object, no ``synonym_values`` key, or not a list of JSON integers).
    """
    for item in reversed(output):
        if getattr(item, "type", None) == "function_call" and getattr(item, "name", None) == EXTRACT_TOOL:
            try:
                arguments = json.loads(item.arguments)
            except (TypeError, ValueError):
                return []
            if not isinstance(arguments, dict) or "synonym_values" not in arguments:
                return []
            try:
                return _INT_LIST.validate_python(arguments["synonym_values"])
            except ValidationError:
                return []
    return []


class ExampleMultiStepResourcesServer(SimpleResourcesServer):
    """The ``example_multi_step`` resources server."""

    config: ExampleMultiStepResourcesServerConfig = Field(
        default_factory=ExampleMultiStepResourcesServerConfig
    )

    def setup_webserver(self) -> FastAPI:
        """Standard routes plus the two tools."""
        app = super().setup_webserver()
        app.post("/get_synonym_value")(self.get_synonym_value)
        app.post(f"/{EXTRACT_TOOL}")(self.extract_synonym_values)
        return app

    async def get_synonym_value(self, body: GetSynonymValueRequest, request: Request,
                                response: Response) -> GetSynonymValueResponse:
        """The value of ``body.synonym`` (see :func:`synonym_value`); a step reward for a new lookup."""
        if self.config.lookup_step_reward:
            seen = self.sessions.get_or_create(self.session_id(request), set)
            set_step_reward(response, 0.0 if body.synonym in seen else self.config.lookup_step_reward)
            seen.add(body.synonym)
        return GetSynonymValueResponse(synonym_value=synonym_value(body.synonym))

    async def extract_synonym_values(self, body: ExtractSynonymValuesRequest) -> ExtractSynonymValuesResponse:
        """Accept the answer; it is scored at ``/verify`` from the episode's last call."""
        return ExtractSynonymValuesResponse(success=True)

    async def verify(self, body: ExampleMultiStepVerifyRequest) -> ExampleMultiStepVerifyResponse:
        """Compare the last submitted values with ``expected_synonym_values``."""
        expected = body.expected_synonym_values
        actual = last_extracted_values(body.response.output)
        accuracy = actual == expected
        if expected:
            set_overlap = len(set(actual) & set(expected)) / len(set(expected))
        else:
            set_overlap = 1.0 if not actual else 0.0
        metrics = {
            "reward": float(accuracy),
            "parsed_synonym_values": actual,
            "accuracy": accuracy,
            "set_overlap": set_overlap,
            "original_term_minefield_hit": body.minefield_label_value in actual,
            "order_instruction_following_failure": not accuracy and set_overlap == 1.0,
        }
        # Merged, not passed twice: a re-verified rollout row may already carry these keys.
        return ExampleMultiStepVerifyResponse(**{**body.model_dump(), **metrics})


if __name__ == "__main__":
    ExampleMultiStepResourcesServer.run_webserver()
