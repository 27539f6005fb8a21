"""What a rollout row says the model did: one outcome per row, read off the row alone.

A reward of 0.000 says nothing about why. :func:`outcome` names it, from the row the run wrote
(the ``/verify`` reply, which echoes the task's tools and the whole episode), in this order:

===================  ==================================================================================
``masked``           ``mask_sample: true``: not a measurement (an infrastructure failure)
``right``            the reward passes (at least :data:`~nemo_gym_env.protocol.metrics.PASS_THRESHOLD`)
*the server's kind*  the row's own ``failure_kind`` (``invalid_instruction``, ``timeout``, ...)
``bad_tool_call``    a tool call the environment could not run (:data:`TOOL_CALL_ERRORS_KEY`): a
                     ``<tool_call>`` block that is not JSON, an unknown tool, arguments that are not JSON
``no_tool_call``     the task offers tools and the model called none: it answered in prose
``cut_off``          the episode hit its turn or token limit with the model still at it (calling tools,
                     playing a game)
``partly_right``     a reward above 0 that does not pass (a partial score)
``wrong``            it answered (after its tool calls, if any) and the verifier said no
===================  ==================================================================================

``rollouts`` counts them per server in its table and ``rollouts_metrics.json``
(``per_server.<name>.outcomes``), and the viewer's summary shows the same counts.

Example:
    >>> row = {"reward": 0.0, "responses_create_params": {"tools": [{"type": "function", "name": "f"}]},
    ...        "response": {"output": [{"type": "message", "role": "assistant", "content": "It is sunny."}]}}
    >>> outcome(row), OUTCOME_TEXT[outcome(row)]
    ('no_tool_call', 'no tool call')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nemo_gym_env.protocol.metrics import numeric_fields, passed

__all__ = ["OUTCOME_TEXT", "TOOL_CALL_ERRORS_KEY", "outcome", "outcome_text"]

TOOL_CALL_ERRORS_KEY = "tool_call_errors"
"""A rollout row's list of the tool calls the environment could not run, each a sentence
(a ``<tool_call>`` block that is not JSON, an unknown tool, arguments that are not JSON)."""

OUTCOME_TEXT = {
    "masked": "masked",
    "right": "right",
    "bad_tool_call": "bad tool call",
    "no_tool_call": "no tool call",
    "cut_off": "cut off",
    "partly_right": "partly right",
    "wrong": "wrong",
}
"""The outcomes :func:`outcome` gives besides a server's own ``failure_kind``, as a table shows them."""


def outcome_text(name: str) -> str:
    """How a table shows an outcome (a server's own kind as it is)."""
    return OUTCOME_TEXT.get(name, name)


def _reward(row: Mapping[str, Any]) -> float:
    return numeric_fields({"reward": row.get("reward")}).get("reward", 0.0)


def _offered_tools(row: Mapping[str, Any]) -> bool:
    params = row.get("responses_create_params")
    tools = params.get("tools") if isinstance(params, Mapping) else None
    return isinstance(tools, list) and any(isinstance(t, Mapping) for t in tools)


def _output(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    response = row.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    return [item for item in output if isinstance(item, Mapping)] if isinstance(output, list) else []


def outcome(row: Mapping[str, Any]) -> str:
    """The outcome of one rollout row (see the module docstring for the names and their order)."""
    if numeric_fields({"mask_sample": row.get("mask_sample")}).get("mask_sample") == 1.0:
        return "masked"
    reward = _reward(row)
    if passed(reward):
        return "right"
    kind = row.get("failure_kind")
    if isinstance(kind, str) and kind:
        return kind[:100]
    errors = row.get(TOOL_CALL_ERRORS_KEY)
    if isinstance(errors, list) and errors:
        return "bad_tool_call"
    output = _output(row)
    called = any(item.get("type") == "function_call" for item in output)
    if _offered_tools(row) and not called:
        return "no_tool_call"
    if row.get("truncated") is True or (output and output[-1].get("type") == "function_call_output"):
        return "cut_off"
    if reward > 0.0:
        return "partly_right"
    return "wrong"
