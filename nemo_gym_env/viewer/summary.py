"""The summary page's numbers: what ``nemo-gym-env rollouts`` prints, plus histograms and failure reasons.

The metrics come from :func:`~nemo_gym_env.metrics.aggregate_metrics` over each row's reward
and task index, read off the index's columns, and the table from
:func:`~nemo_gym_env.rollouts.metrics_table`: the same code, so the same numbers as
:func:`~nemo_gym_env.rollouts.summarize` and the command's table, without reading the rows
again. Failures count as ``rollouts`` counts them: a sidecar row whose (task, rollout) has no
output row.

Example:
    >>> from nemo_gym_env.viewer.index import JsonlIndex
    >>> index = JsonlIndex("results/rollouts.jsonl"); index.refresh()   # doctest: +SKIP
    >>> file_summary(index, None)["servers"][0]["mean_reward"]           # doctest: +SKIP
    0.25
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from ..metrics import TASK_INDEX_KEY, aggregate_metrics
from ..rollouts import metrics_table
from .index import JsonlIndex

__all__ = ["HISTOGRAM_BINS", "file_summary", "histogram"]

HISTOGRAM_BINS = 10

_ALL = "all"  # summarize's name for rows without agent_ref.name


def histogram(rewards: Sequence[float], bins: int = HISTOGRAM_BINS) -> list[dict[str, float]]:
    """Counts of rewards in equal bins over [0, 1] (or over [min, max] when rewards leave it).

    Example:
        >>> [b["count"] for b in histogram([0.0, 0.0, 1.0], bins=2)]
        [2, 1]
    """
    if not rewards:
        return []
    low, high = min(rewards), max(rewards)
    if low >= 0.0 and high <= 1.0:
        low, high = 0.0, 1.0
    if high == low:
        return [{"low": low, "high": high, "count": len(rewards)}]
    width = (high - low) / bins
    counts = [0] * bins
    for reward in rewards:
        counts[min(int((reward - low) / width), bins - 1)] += 1
    return [{"low": round(low + i * width, 12), "high": round(low + (i + 1) * width, 12), "count": c}
            for i, c in enumerate(counts)]


def _pass_at(agent: dict[str, Any]) -> list[dict[str, float]]:
    found = []
    for key, value in agent.items():
        match = re.fullmatch(r"pass@(\d+)/reward", key)
        if match:
            found.append({"k": int(match.group(1)), "percent": value})
    return sorted(found, key=lambda item: item["k"])


def _reason_kind(reason: str) -> str:
    """A failure reason with its numbers and quoted names blurred, so alike failures count together."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", reason))[:200]


def file_summary(rollouts: JsonlIndex, failures: JsonlIndex | None) -> dict[str, Any]:
    """Per server and in total: rollouts, failures, mean reward, pass@k, histogram; failures by reason; the table."""
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    rewards: dict[str, list[float]] = defaultdict(list)
    keys: set[tuple[int, int]] = set()
    reasons: Counter[tuple[str, str, str]] = Counter()
    examples: dict[tuple[str, str, str], str] = {}
    unkeyed = 0
    for number in range(len(rollouts)):
        task, rollout = rollouts.int_value("task", number), rollouts.int_value("rollout", number)
        if task is None or rollout is None:  # not a rollout row by rollouts' rules: left out, as summarize would
            unkeyed += 1
            continue
        keys.add((task, rollout))
        server = rollouts.servers[rollouts.server_ids[number]] or _ALL
        slim: dict[str, Any] = {TASK_INDEX_KEY: task}
        reward = rollouts.rewards[number]
        if not math.isnan(reward):
            slim["reward"] = reward
            rewards[server].append(reward)
        rows[server].append(slim)
        failure = rollouts.failures.get(number)
        if failure:
            kind = (server, "verify", _reason_kind(failure))
            reasons[kind] += 1
            examples.setdefault(kind, failure)
    failed: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for number in range(len(failures) if failures is not None else 0):
        task, rollout = failures.int_value("task", number), failures.int_value("rollout", number)
        if task is None or rollout is None or (task, rollout) in keys:
            continue
        server = failures.servers[failures.server_ids[number]] or _ALL
        failed[server].add((task, rollout))
        reason = failures.failures.get(number) or "(no reason given)"
        kind = (server, "failed rollout", _reason_kind(reason))
        reasons[kind] += 1
        examples.setdefault(kind, reason)

    everything = [row for group in rows.values() for row in group]
    summary: dict[str, Any] = {
        "output": str(rollouts.path),
        "num_rollouts": len(everything),
        "num_failed": sum(len(v) for v in failed.values()),
        **aggregate_metrics(everything).model_dump(exclude={"group_level_metrics"}),
        "per_server": {},
    }
    servers = []
    for name in sorted(set(rows) | set(failed)):
        metrics = aggregate_metrics(rows.get(name, []))
        summary["per_server"][name] = {
            "num_rollouts": len(rows.get(name, [])),
            "num_failed": len(failed.get(name, ())),
            "agent_metrics": metrics.agent_metrics,
            "key_metrics": metrics.key_metrics,
        }
        servers.append(_server(name, summary["per_server"][name], rewards.get(name, [])))
    total = _server("total", summary, [r for group in rewards.values() for r in group])
    return {
        "table": metrics_table(summary),
        "metrics": summary,
        "servers": servers,
        "total": total,
        "unkeyed_rows": unkeyed,
        "failures_by_reason": [
            {"server": server, "source": source, "reason": reason, "count": count,
             "example": examples[(server, source, reason)]}
            for (server, source, reason), count in reasons.most_common(100)
        ],
    }


def _server(name: str, entry: dict[str, Any], rewards: list[float]) -> dict[str, Any]:
    agent = entry["agent_metrics"]
    return {
        "name": name,
        "num_rollouts": entry["num_rollouts"],
        "num_failed": entry["num_failed"],
        "num_tasks": agent.get("num_tasks", 0),
        "mean_reward": agent.get("mean/reward"),
        "pass_at": _pass_at(agent),
        "histogram": histogram(rewards),
    }
