"""What the viewer reads off one rollout row: its list columns, and a copy safe to send as JSON.

A rollout row is NeMo Gym's ``/verify`` reply plus ``_ng_task_index``, ``_ng_rollout_index``
and ``agent_ref``; a failed rollout (the ``<stem>_failures.jsonl`` sidecar) carries
``_ng_failure_class`` and ``failure_reason`` instead of a reward. Nothing else about a row is
assumed: every field may be missing or of another type, and the columns are then blank.

Example:
    >>> row = {"agent_ref": {"type": "resources_servers", "name": "math"}, "_ng_task_index": 3,
    ...        "_ng_rollout_index": 1, "reward": 1.0, "response": {"output": [
    ...            {"type": "function_call", "name": "calc", "arguments": "{}", "call_id": "c1"},
    ...            {"type": "function_call_output", "call_id": "c1", "output": "4"},
    ...            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]}],
    ...        "usage": {"input_tokens": 50, "output_tokens": 7}}}
    >>> stats = row_stats(row)
    >>> stats.server, stats.task, stats.turns, stats.tool_calls, stats.tokens
    ('math', 3, 2, 1, 57)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nemo_gym_env.protocol.keys import FAILURE_CLASS_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, TASK_KEY_KEY
from nemo_gym_env.protocol.metrics import numeric_fields
from nemo_gym_env.system.redaction import REDACTED, redact

__all__ = ["MAX_DEPTH", "RowStats", "Scrubber", "count_tokens", "count_turns", "row_stats", "server_name"]

MAX_DEPTH = 64
"""JSON nested deeper than this is sent as a note, not as structure: the page and the encoders
recurse, and a hostile row must not exhaust their stacks."""

# Beyond 2**53 a JSON number loses digits in a browser; such integers are sent as text.
_EXACT_IN_JS = 2**53

# Items the environment produced; every other item of ``response.output`` is the model's.
_ENVIRONMENT_ITEMS = frozenset({"function_call_output"})


@dataclass(frozen=True)
class RowStats:
    """The list columns of one row; None where the row does not say.

    Attributes:
        server: ``agent_ref.name``.
        task: ``_ng_task_index``.
        task_key: ``_ng_task_key``, the task's identity (:mod:`~nemo_gym_env.rollouts.identity`).
        rollout: ``_ng_rollout_index``.
        reward: A finite ``reward``.
        turns: Model turns: runs of model items between environment items in ``response.output``.
        tool_calls: ``function_call`` items in ``response.output``.
        tokens: ``usage.input_tokens + output_tokens``, else the summed ``generation_token_ids``.
        failure: Why the rollout failed: the sidecar's class and reason, or the verify reply's
            ``failure_reason`` / ``failure_kind``.
    """

    server: str | None
    task: int | None
    rollout: int | None
    task_key: str | None
    reward: float | None
    turns: int | None
    tool_calls: int | None
    tokens: int | None
    failure: str | None


def server_name(row: Mapping[str, Any]) -> str | None:
    """``agent_ref.name`` when it is a non-empty string."""
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _output_items(row: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    response = row.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(output, list):
        return None
    return [item for item in output if isinstance(item, Mapping)]


def count_turns(items: Iterable[Mapping[str, Any]]) -> int:
    """Model turns in an episode's output items: each run of model items between environment items.

    Example:
        >>> count_turns([{"type": "function_call"}, {"type": "function_call"},
        ...              {"type": "function_call_output"}, {"type": "function_call_output"},
        ...              {"type": "message", "role": "assistant"}])
        2
    """
    turns, in_turn = 0, False
    for item in items:
        model = item.get("type") not in _ENVIRONMENT_ITEMS and item.get("role") not in ("user", "system", "developer")
        if model and not in_turn:
            turns += 1
        in_turn = model
    return turns


def count_tokens(row: Mapping[str, Any]) -> int | None:
    """``usage.input_tokens + usage.output_tokens``; else the lengths of every ``generation_token_ids``."""
    response = row.get("response")
    usage = response.get("usage") if isinstance(response, Mapping) else None
    if isinstance(usage, Mapping):
        used = [_index(usage.get("input_tokens")), _index(usage.get("output_tokens"))]
        if None not in used:
            return used[0] + used[1]
    generated = [item.get("generation_token_ids") for item in _output_items(row) or ()]
    lengths = [len(ids) for ids in generated if isinstance(ids, list)]
    return sum(lengths) if lengths else None


def _failure(row: Mapping[str, Any]) -> str | None:
    reason = row.get("failure_reason")
    reason = reason if isinstance(reason, str) and reason else None
    kind = row.get(FAILURE_CLASS_KEY) or row.get("failure_kind")
    kind = kind if isinstance(kind, str) and kind else None
    if kind and reason:
        return f"{kind}: {reason}"
    return kind or reason


def row_stats(row: Mapping[str, Any]) -> RowStats:
    """The list columns of a rollout row (or a failure row of the sidecar)."""
    items = _output_items(row)
    # numeric_fields is what the metrics use: the same rewards count (booleans as 0/1, non-finite as none).
    reward = numeric_fields({"reward": row.get("reward")}).get("reward")
    return RowStats(
        server=server_name(row),
        task=_index(row.get(TASK_INDEX_KEY)),
        rollout=_index(row.get(ROLLOUT_INDEX_KEY)),
        task_key=row.get(TASK_KEY_KEY) if isinstance(row.get(TASK_KEY_KEY), str) else None,
        reward=reward,
        turns=None if items is None else count_turns(items),
        tool_calls=None if items is None else sum(1 for item in items if item.get("type") == "function_call"),
        tokens=count_tokens(row),
        failure=_failure(row),
    )


class Scrubber:
    """Makes any parsed JSON value safe to send to the page: secrets masked, numbers exact, depth bounded.

    Every string (keys too) goes through :func:`~nemo_gym_env.launch.config.redact` (``sk-...`` keys,
    ``Bearer`` credentials, URL passwords) and loses every known secret value (those of
    ``env.yaml``). Non-finite floats, which JSON cannot carry, and integers a browser would
    round become text; containers nested deeper than :data:`MAX_DEPTH` become a note.

    Example:
        >>> scrub = Scrubber(["hunter2-secret"])
        >>> scrub.value({"reply": "the key is hunter2-secret", "big": 10**20, "x": float("inf")})
        {'reply': 'the key is ***REDACTED***', 'big': '100000000000000000000', 'x': 'Infinity'}
    """

    def __init__(self, secrets: Iterable[str] = ()):
        # Short values would scrub ordinary words out of every page; longest first, so that a
        # secret containing another is replaced whole.
        self.secrets = sorted({s for s in secrets if isinstance(s, str) and len(s) >= 4}, key=len, reverse=True)

    def text(self, text: str) -> str:
        """``text`` with every secret masked."""
        text = redact(text)
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def value(self, value: Any, depth: int = 0) -> Any:
        """A JSON-safe, secret-free copy of a parsed JSON value."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            return value if -_EXACT_IN_JS <= value <= _EXACT_IN_JS else str(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else ("NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity"))
        if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
            return f"(JSON nested deeper than {MAX_DEPTH} levels: not shown)"
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, depth + 1) for v in value]
        return self.text(repr(value))
