"""Aggregate metrics over verify replies, named the way NeMo Gym names them.

``mean/<field>``, ``max/``, ``min/``, ``median/``, ``std/`` for every numeric field of the
verify replies, and over tasks grouped by ``_ng_task_index``: ``pass@<k>/reward`` (the
unbiased combinatorial estimate for 0/1 rewards, max-of-first-k for continuous ones) and
``pass@1[avg-of-<k>]/reward``, both in percent as NeMo Gym reports them.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nemo_gym_env.protocol.keys import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym_env.protocol.types import AggregateMetrics

__all__ = ["TASK_INDEX_KEY", "ROLLOUT_INDEX_KEY", "aggregate_metrics", "pass_at_k", "numeric_fields"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` draws from ``n`` samples with ``c`` correct is correct.

    Example:
        >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4)
        (0.25, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def numeric_fields(row: Mapping[str, Any]) -> dict[str, float]:
    """Top-level finite numeric (and boolean) fields of a verify reply, bookkeeping keys excluded."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key.startswith("_ng_") or isinstance(value, str) or not isinstance(value, (bool, int, float)):
            continue
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float (10**400): not a usable metric
            continue
        if math.isfinite(number):
            out[key] = number
    return out


def _reward(row: Mapping[str, Any]) -> float:
    """A row's reward; a missing, non-numeric or non-finite one counts as 0.0 (as a failed verify does)."""
    return numeric_fields({"reward": row.get("reward")}).get("reward", 0.0)


def _hashable_index(value: Any) -> Any:
    """A task index usable as a dict key (an unhashable one, e.g. a list, by its text)."""
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _k_values(n: int) -> list[int]:
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    ks.append(n)
    return ks


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "max": max(values),
        "min": min(values),
        "median": statistics.median(values),
        "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
    }


def aggregate_metrics(verify_responses: Iterable[Mapping[str, Any]], *,
                      group_key: str = TASK_INDEX_KEY) -> AggregateMetrics:
    """Aggregate verify replies into agent-level, per-task and headline metrics.

    Rollouts of one task are the rows with the same ``group_key`` (NeMo Gym's task index by
    default; a rollouts file is grouped by its rows' task identity instead).

    Example:
        >>> rows = [{"_ng_task_index": 0, "reward": 1.0}, {"_ng_task_index": 0, "reward": 0.0},
        ...         {"_ng_task_index": 1, "reward": 0.0}, {"_ng_task_index": 1, "reward": 0.0}]
        >>> m = aggregate_metrics(rows).agent_metrics
        >>> m["mean/reward"], m["pass@2/reward"]
        (0.25, 50.0)
    """
    rows = list(verify_responses)
    if not rows:
        return AggregateMetrics()
    columns: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in numeric_fields(row).items():
            columns[key].append(value)
    agent: dict[str, Any] = {"num_rollouts": len(rows)}
    for key, values in columns.items():
        for stat, value in _summary(values).items():
            agent[f"{stat}/{key}"] = value

    groups: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[_hashable_index(row.get(group_key, 0))].append(row)
    agent["num_tasks"] = len(groups)
    per_task = []
    for task_index in sorted(groups, key=lambda t: (str(type(t)), t)):
        rewards = [_reward(r) for r in groups[task_index]]
        per_task.append({group_key: task_index, "num_rollouts": len(rewards), **{
            f"{stat}/reward": v for stat, v in _summary(rewards).items()}})

    reward_lists = [[_reward(r) for r in g] for g in groups.values()]
    n = min(len(r) for r in reward_lists)
    binary = all(v in (0.0, 1.0) for r in reward_lists for v in r)
    for k in _k_values(n):
        if binary:
            scores = [pass_at_k(len(r), int(sum(r)), k) for r in reward_lists]
        else:
            scores = [max(r[:k]) for r in reward_lists]
        agent[f"pass@{k}/reward"] = 100.0 * statistics.fmean(scores)
        agent[f"pass@1[avg-of-{k}]/reward"] = 100.0 * statistics.fmean(statistics.fmean(r[:k]) for r in reward_lists)

    key = {k: v for k, v in agent.items() if k.startswith("mean/")}
    key[f"pass@{n}/reward"] = agent[f"pass@{n}/reward"]
    return AggregateMetrics(group_level_metrics=per_task, agent_metrics=agent, key_metrics=key)
