"""The wire, with no I/O: what travels between a model, an env and a resources server.

- :mod:`~nemo_gym_env.protocol.types`: the wire types (Responses items and ``Response``,
  create params, seed/verify bodies), with the Responses API's field names;
- :mod:`~nemo_gym_env.protocol.items`: the rules for items as plain data (what kind an item is,
  its text, the one check of a model turn);
- :mod:`~nemo_gym_env.protocol.parser`: raw model text <-> items (``<think>``, ``<tool_call>``);
- :mod:`~nemo_gym_env.protocol.dataset`: task rows (NeMo Gym's JSONL) read and checked;
- :mod:`~nemo_gym_env.protocol.metrics`: aggregate metrics of verify replies (``pass@k``...);
- :mod:`~nemo_gym_env.protocol.outcomes`: what a rollout row says the model did (no tool call, ...);
- :mod:`~nemo_gym_env.protocol.keys`: the bookkeeping keys of rollout rows and the token fields;
- :mod:`~nemo_gym_env.protocol.scripting`: items built by hand, as scripted players and the
  play page build a model turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.protocol.dataset import RowProblem, check_row, input_items, iter_rows, load_rows
    from nemo_gym_env.protocol.items import check_turn, content_text, is_model_item, item_kind, plain
    from nemo_gym_env.protocol.keys import (
        AGENT_REF_KEY,
        FAILURE_CLASS_KEY,
        ROLLOUT_INDEX_KEY,
        TASK_INDEX_KEY,
        TOKEN_FIELDS,
    )
    from nemo_gym_env.protocol.metrics import aggregate_metrics, numeric_fields, pass_at_k
    from nemo_gym_env.protocol.outcomes import outcome
    from nemo_gym_env.protocol.parser import items_to_text, parse_model_text, render_tool_call
    from nemo_gym_env.protocol.types import Response, make_response

__all__ = [
    "AGENT_REF_KEY",
    "FAILURE_CLASS_KEY",
    "ROLLOUT_INDEX_KEY",
    "TASK_INDEX_KEY",
    "TOKEN_FIELDS",
    "Response",
    "RowProblem",
    "aggregate_metrics",
    "check_row",
    "check_turn",
    "content_text",
    "input_items",
    "is_model_item",
    "item_kind",
    "items_to_text",
    "iter_rows",
    "load_rows",
    "make_response",
    "numeric_fields",
    "outcome",
    "parse_model_text",
    "pass_at_k",
    "plain",
    "render_tool_call",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("RowProblem", "check_row", "input_items", "iter_rows", "load_rows"),
                    "nemo_gym_env.protocol.dataset"),
    **dict.fromkeys(("check_turn", "content_text", "is_model_item", "item_kind", "plain"),
                    "nemo_gym_env.protocol.items"),
    **dict.fromkeys(("AGENT_REF_KEY", "FAILURE_CLASS_KEY", "ROLLOUT_INDEX_KEY", "TASK_INDEX_KEY",
                     "TOKEN_FIELDS"),
                    "nemo_gym_env.protocol.keys"),
    **dict.fromkeys(("aggregate_metrics", "numeric_fields", "pass_at_k"), "nemo_gym_env.protocol.metrics"),
    "outcome": "nemo_gym_env.protocol.outcomes",
    **dict.fromkeys(("items_to_text", "parse_model_text", "render_tool_call"), "nemo_gym_env.protocol.parser"),
    **dict.fromkeys(("Response", "make_response"), "nemo_gym_env.protocol.types"),
})
