"""The summary page's numbers: what ``nemo-gym-env rollouts`` prints, plus histograms and failure reasons.

The metrics come from :func:`~nemo_gym_env.rollouts.report.summarize_outcomes`, the very code
behind :func:`~nemo_gym_env.rollouts.report.summarize` and the command's table, fed each row's
identity, reward, ``mask_sample``, ``failure_kind`` and outcome off the index's columns (which
the index read with the functions ``rollouts`` reads a row with), so the rows are not read again. Failures count as
``rollouts`` counts them: a sidecar row whose identity (server, task, rollout) has no output row.

Example:
    >>> from nemo_gym_env.viewer.index import JsonlIndex
    >>> index = JsonlIndex("results/rollouts.jsonl"); index.refresh()   # doctest: +SKIP
    >>> file_summary(index, None)["servers"][0]["mean_reward"]           # doctest: +SKIP
    0.25
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from nemo_gym_env.protocol.outcomes import outcome_text
from nemo_gym_env.rollouts.report import Outcome, metrics_table, summarize_outcomes
from nemo_gym_env.viewer.index import JsonlIndex

__all__ = ["HISTOGRAM_BINS", "file_summary", "histogram"]

HISTOGRAM_BINS = 10

_ALL = "all"  # summarize's name for rows without agent_ref.name


def histogram(rewards: Sequence[float], bins: int = HISTOGRAM_BINS) -> list[dict[str, Any]]:
    """Counts of rewards, each bin with the ``label`` a page shows under it.

    Up to ``bins`` distinct rewards (a binary or few-valued reward): one bin per value, labelled by it, so a
    1.0 reads "1.0". More: equal bins over [0, 1] (or over [min, max] when rewards leave it), labelled by
    their range, "[0.9, 1.0]" (each bin holds its low edge; the last its high one too).

    Example:
        >>> [(b["label"], b["count"]) for b in histogram([0.0, 0.0, 1.0])]
        [('0.0', 2), ('1.0', 1)]
    """
    if not rewards:
        return []
    values = Counter(float(r) for r in rewards)
    if len(values) <= bins:
        return [{"low": v, "high": v, "count": values[v], "label": _number(v)} for v in sorted(values)]
    low, high = min(rewards), max(rewards)
    if low >= 0.0 and high <= 1.0:
        low, high = 0.0, 1.0
    width = (high - low) / bins
    counts = [0] * bins
    for reward in rewards:
        counts[min(int((reward - low) / width), bins - 1)] += 1
    edges = [round(low + i * width, 12) for i in range(bins)] + [high]
    return [{"low": edges[i], "high": edges[i + 1], "count": c,
             "label": f"[{_number(edges[i])}, {_number(edges[i + 1])}{']' if i == bins - 1 else ')'}"}
            for i, c in enumerate(counts)]


def _number(value: float) -> str:
    """A reward as a person reads it: 1.0, 0.0, -0.12, 0.333."""
    return f"{value:.1f}" if float(value).is_integer() else f"{round(value, 3):g}"


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


def _outcome(index: JsonlIndex, number: int) -> Outcome | None:
    """Row ``number``'s identity and reward, as :func:`~nemo_gym_env.rollouts.report.outcome_of` reads a row."""
    task, rollout = index.int_value("task", number), index.int_value("rollout", number)
    if task is None or rollout is None:  # not a rollout row by rollouts' rules
        return None
    stats = index.stats(number)
    numbers = {} if stats.reward is None else {"reward": stats.reward}
    if stats.outcome == "masked":
        numbers["mask_sample"] = 1.0
    return Outcome(stats.server or _ALL, stats.task_key if stats.task_key is not None else f"#{task}", rollout,
                   numbers, failure_kind=stats.failure_kind, outcome=stats.outcome or "wrong")


def file_summary(rollouts: JsonlIndex, failures: JsonlIndex | None) -> dict[str, Any]:
    """Per server and in total: rollouts, failures, mean reward, pass@k, histogram; failures by reason; the table."""
    outcomes: list[Outcome] = []
    rewards: dict[str, list[float]] = defaultdict(list)
    reasons: Counter[tuple[str, str, str]] = Counter()
    examples: dict[tuple[str, str, str], str] = {}
    unkeyed = 0
    for number in range(len(rollouts)):
        outcome = _outcome(rollouts, number)
        if outcome is None:  # left out, as summarize would
            unkeyed += 1
            continue
        outcomes.append(outcome)
        if "reward" in outcome.numbers:
            rewards[outcome.server].append(outcome.numbers["reward"])
        failure = rollouts.failures.get(number)
        if failure:
            kind = (outcome.server, "verify", _reason_kind(failure))
            reasons[kind] += 1
            examples.setdefault(kind, failure)
    finished = {(o.server, o.task, o.rollout) for o in outcomes}
    failed: list[Outcome] = []
    for number in range(len(failures) if failures is not None else 0):
        outcome = _outcome(failures, number)
        if outcome is None or (outcome.server, outcome.task, outcome.rollout) in finished:
            continue
        failed.append(outcome)
        reason = failures.failures.get(number) or "(no reason given)"
        kind = (outcome.server, "failed rollout", _reason_kind(reason))
        reasons[kind] += 1
        examples.setdefault(kind, reason)

    summary = summarize_outcomes(str(rollouts.path), outcomes, failed)
    summary.pop("group_level_metrics", None)
    servers = [_server(name, entry, rewards.get(name, [])) for name, entry in summary["per_server"].items()]
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
        "num_masked": entry.get("num_masked", 0),
        "outcomes": [{"outcome": kind, "text": outcome_text(kind), "count": count}
                     for kind, count in entry.get("outcomes", {}).items()],
        "pass_at": _pass_at(agent),
        "histogram": histogram(rewards),
    }
