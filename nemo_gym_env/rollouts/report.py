"""What a rollouts run reports: metrics of the whole file, per server, and the progress line.

The numbers are NeMo Gym's (``mean/reward``, ``pass@k/reward``...), computed by
:func:`~nemo_gym_env.protocol.metrics.aggregate_metrics` per server (``agent_ref.name``) and over
everything; :func:`summarize` is what ``<output stem>_metrics.json`` holds.

A masked sample (``mask_sample: true`` in the row: NeMo Gym 0.7's mark of an infrastructure
failure, whose reward is not a measurement) is counted (``num_masked``) and left out of the
reward metrics; each row's ``failure_kind`` is counted per kind (``failure_kinds``), and each
row's :func:`~nemo_gym_env.protocol.outcomes.outcome` (what the model did: no tool call, a bad
tool call, wrong, right, or the server's own kind) per outcome (``outcomes``).

The command's table, ``<output stem>_metrics.json`` and the viewer's summary are all
:func:`summarize_outcomes` of the same :class:`Outcome` of each row.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from nemo_gym_env.protocol.keys import TASK_KEY_KEY
from nemo_gym_env.protocol.metrics import PASS_THRESHOLD, aggregate_metrics, numeric_fields
from nemo_gym_env.protocol.outcomes import outcome, outcome_text
from nemo_gym_env.rollouts.identity import legacy_key, row_identity
from nemo_gym_env.rollouts.output import failures_path, is_failure, metrics_path, scan_rollouts

__all__ = ["OUTCOME_MEANING", "Outcome", "Progress", "component_means", "metrics_table", "outcome_of", "summarize", "summarize_outcomes", "text_table",
           "write_metrics"]


@dataclass(frozen=True)
class Outcome:
    """What the metrics need of one rollout row: its identity and its numbers."""

    server: str
    task: str
    """The task key, or ``"#<index>"`` for a row written without one."""
    rollout: int
    numbers: dict[str, float]
    components: dict[str, float] = field(default_factory=dict)
    """The row's ``reward_components`` (its finite numbers)."""
    failure_kind: str | None = None
    """The row's ``failure_kind``, if it names one."""
    outcome: str = "wrong"
    """What the model did (:func:`~nemo_gym_env.protocol.outcomes.outcome`)."""

    @property
    def masked(self) -> bool:
        """Whether the row is a masked sample (``mask_sample: true``): left out of the reward metrics."""
        return self.outcome == "masked"


def outcome_of(row: Mapping[str, Any]) -> Outcome | None:
    """The :class:`Outcome` of a rollout (or failure) row; None when it has no identity."""
    identity = row_identity(row)
    if identity is None:
        legacy = legacy_key(row)
        if legacy is None:
            return None
        identity = (legacy[0], f"#{legacy[1]}", legacy[2])
    server, task, rollout = identity
    kind = row.get("failure_kind")
    components = row.get("reward_components")
    parts = numeric_fields(components) if isinstance(components, Mapping) else {}
    return Outcome(server or "all", task, rollout, numeric_fields(row), parts,
                   kind[:100] if isinstance(kind, str) else None, outcome(row))


def summarize(output: str | Path) -> dict[str, Any]:
    """Aggregate metrics of a rollouts file, overall and per server (``agent_ref.name``).

    Rollouts of one task are grouped by the task's identity (its key; the task index for rows
    written without one), per server. Failures still standing (in the sidecar, with no output
    row of the same identity) are counted once each as ``num_failed``. The result is what
    ``<output stem>_metrics.json`` holds. Both files are streamed: only the numbers the metrics
    need are kept.
    """
    output = Path(output)
    outcomes: list[Outcome] = []
    if output.exists():
        scan_rollouts(output, lambda row: outcomes.append(outcome_of(row)))
    failures: list[Outcome] = []
    sidecar = failures_path(output)
    if sidecar.exists():
        with open(sidecar, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a torn line a kill left behind: the rollout is retried by --resume
                failure = outcome_of(row) if isinstance(row, dict) else None
                if failure is not None:
                    failures.append(failure)
    return summarize_outcomes(str(output), outcomes, failures)


def summarize_outcomes(output: str, outcomes: Iterable[Outcome], failures: Iterable[Outcome]) -> dict[str, Any]:
    """:func:`summarize` of outcomes already read: the metrics per server and in all.

    A failure counts once per identity, and only while no outcome has that identity.
    """
    slim: dict[str, list[dict[str, Any]]] = defaultdict(list)
    parts: dict[str, list[dict[str, float]]] = defaultdict(list)
    finished = set()
    masked: Counter = Counter()
    kinds: dict[str, Counter] = defaultdict(Counter)
    did: dict[str, Counter] = defaultdict(Counter)
    for one in outcomes:
        finished.add((one.server, one.task, one.rollout))
        did[one.server][one.outcome] += 1
        if one.failure_kind is not None:
            kinds[one.server][one.failure_kind] += 1
        if one.masked:  # not a measurement: counted, kept out of the reward metrics
            masked[one.server] += 1
            continue
        parts[one.server].append(one.components)
        slim[one.server].append({**one.numbers, TASK_KEY_KEY: one.task,
                                 _TOTAL_GROUP: f"{one.server}/{one.task}"})
    failed: dict[str, set] = defaultdict(set)
    for failure in failures:
        identity = (failure.server, failure.task, failure.rollout)
        if identity not in finished:
            failed[failure.server].add(identity)
    everything = [r for group in slim.values() for r in group]
    every_kind: Counter = sum(kinds.values(), Counter())
    summary: dict[str, Any] = {
        "output": output,
        "pass_threshold": PASS_THRESHOLD,
        "num_rollouts": len(everything) + sum(masked.values()),
        "num_failed": sum(len(v) for v in failed.values()),
        "num_masked": sum(masked.values()),
        "failure_kinds": dict(sorted(every_kind.items())),
        "outcomes": _by_count(sum(did.values(), Counter())),
        **aggregate_metrics(everything, group_key=_TOTAL_GROUP).model_dump(),
        "reward_components": component_means([c for group in parts.values() for c in group]),
        "per_server": {},
    }
    for name in sorted(set(slim) | set(failed) | set(masked)):
        metrics = aggregate_metrics(slim.get(name, []), group_key=TASK_KEY_KEY)
        summary["per_server"][name] = {
            "num_rollouts": len(slim.get(name, [])) + masked[name],
            "num_failed": len(failed.get(name, ())),
            "num_masked": masked[name],
            "failure_kinds": dict(sorted(kinds[name].items())),
            "outcomes": _by_count(did[name]),
            "agent_metrics": metrics.agent_metrics,
            "key_metrics": metrics.key_metrics,
            "reward_components": component_means(parts.get(name, [])),
        }
    return summary


def _by_count(counts: Counter) -> dict[str, int]:
    """Counts, most frequent first (ties by name)."""
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def component_means(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each reward component over the rows that have it (``{}`` when none has any).

    Example:
        >>> component_means([{"a": 1.0, "b": 0.0}, {"a": 0.0}, {}])
        {'a': 0.5, 'b': 0.0}
    """
    columns: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for name, value in row.items():
            columns[name].append(value)
    return {name: sum(values) / len(values) for name, values in sorted(columns.items())}


_TOTAL_GROUP = "_task"  # server and task together: two servers' tasks never share a group


def write_metrics(output: str | Path) -> dict[str, Any]:
    """:func:`summarize` the rollouts file and write it to ``<output stem>_metrics.json``; returns it."""
    summary = summarize(output)
    metrics_path(output).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def metrics_table(summary: Mapping[str, Any]) -> str:
    """The summary as a text table: one line per server, then the total, then what the outcomes mean.

    ``mean/reward`` and pass@k leave masked samples out (``masked`` counts them); pass@k counts
    rollouts whose reward passes (:data:`~nemo_gym_env.protocol.metrics.PASS_THRESHOLD`), so it
    is a rate whatever the rewards are; ``what the model did`` counts each row's outcome
    (:mod:`~nemo_gym_env.protocol.outcomes`).
    """

    def line(name: str, rollouts: int, failed: int, agent: Mapping[str, Any], masked: int,
             outcomes: Mapping[str, int]) -> list[str]:
        ks = sorted(int(k[5:].split("/")[0]) for k in agent if k.startswith("pass@") and k[5:].split("/")[0].isdigit())
        k = ks[-1] if ks else None
        mean = agent.get("mean/reward")
        return [
            name,
            str(agent.get("num_tasks", 0)),
            str(rollouts),
            str(failed),
            "-" if mean is None else f"{mean:.3f}",
            "-" if "pass@1/reward" not in agent else f"{agent['pass@1/reward']:.1f}",
            "-" if k is None or k == 1 else f"{agent[f'pass@{k}/reward']:.1f} (k={k})",
            str(masked),
            ", ".join(f"{outcome_text(kind)} {n}" for kind, n in outcomes.items()) or "-",
        ]

    table = [["server", "tasks", "rollouts", "failed", "mean/reward", "pass@1 %", "pass@k %", "masked",
              "what the model did"]]
    per_server = summary.get("per_server", {})
    for name, entry in per_server.items():
        table.append(line(name, entry["num_rollouts"], entry["num_failed"], entry["agent_metrics"],
                          entry.get("num_masked", 0), entry.get("outcomes", {})))
    if len(per_server) != 1:
        table.append(line("total", summary["num_rollouts"], summary["num_failed"], summary["agent_metrics"],
                          summary.get("num_masked", 0), summary.get("outcomes", {})))
    text = text_table(table, numeric=True, left=(0, 8))
    seen = {kind for entry in [summary, *per_server.values()] for kind in entry.get("outcomes", {})}
    legend = [f"{outcome_text(kind)}: {OUTCOME_MEANING[kind]}" for kind in OUTCOME_MEANING if kind in seen]
    legend += [f"{kind}: the server's own failure_kind" for kind in sorted(seen - set(OUTCOME_MEANING))]
    if legend:
        text += "\n\n" + "\n".join(legend)
    parts = [["server", "reward component", "mean"]]
    for name, entry in per_server.items():
        parts += [[name, part, f"{mean:.3f}"] for part, mean in (entry.get("reward_components") or {}).items()]
    if len(parts) > 1:
        text += "\n\n" + text_table(parts)
    return text


OUTCOME_MEANING = {
    "right": f"the reward passed (at least {PASS_THRESHOLD:.1f}; pass@k counts these)",
    "partly_right": "a reward above 0 that does not pass",
    "no_tool_call": "the task offers tools and the model called none: it answered in prose",
    "bad_tool_call": "a tool call the environment could not run (not JSON, an unknown tool, bad arguments)",
    "cut_off": "the episode hit --max-steps or --max-episode-tokens with the model still at it",
    "wrong": "answered, and the verifier said no",
    "masked": "mask_sample: an infrastructure failure, not a measurement",
}
"""The legend under the table; a server's own ``failure_kind`` is shown as it is."""


def text_table(rows: Sequence[Sequence[str]], *, numeric: bool = False, left: Sequence[int] = (0,)) -> str:
    """Rows of cells as aligned text, a rule under the first (header) row.

    Columns are left-aligned; with ``numeric`` every column but those in ``left`` (the first)
    is right-aligned.

    Example:
        >>> print(text_table([["name", "n"], ["a", "10"]], numeric=True))
        name   n
        ----  --
        a     10
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for number, row in enumerate(rows):
        cells = [cell.rjust(w) if numeric and i not in left else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
        if number == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


class Progress:
    """A progress line on stderr: done/total, rate, mean reward, failures, ETA.

    On a terminal it redraws one line in place; otherwise it prints a plain line at every
    10% and at least every 30 s, so logs stay readable.
    """

    def __init__(self, total: int, *, initial: int = 0, stream: IO[str] | None = None, label: str = "rollouts"):
        self.total = total
        self.initial = initial
        self.stream = stream or sys.stderr
        self.label = label
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.count = 0
        self.failed = 0
        self._reward_sum = 0.0
        self._rewarded = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._next_pct = 10
        self._drawn = False

    def update(self, row: Mapping[str, Any]) -> None:
        """Count one finished rollout (or failure)."""
        self.count += 1
        if is_failure(row):
            self.failed += 1
        elif isinstance(row.get("reward"), (int, float)) and outcome(row) != "masked":  # as the table counts
            self._reward_sum += float(row["reward"])
            self._rewarded += 1
        now = time.monotonic()
        pct = 100 * (self.initial + self.count) / max(self.total, 1)
        if self.tty:
            if now - self._last_draw >= 0.1 or self.initial + self.count >= self.total:
                self._draw(now)
        elif pct >= self._next_pct or now - self._last_draw >= 30.0:
            while self._next_pct <= pct:
                self._next_pct += 10
            self._draw(now)

    def text(self, now: float | None = None) -> str:
        """The current progress line."""
        now = time.monotonic() if now is None else now
        done = self.initial + self.count
        elapsed = max(now - self._start, 1e-9)
        rate = self.count / elapsed
        pct = 100 * done / max(self.total, 1)
        mean = f"{self._reward_sum / self._rewarded:.3f}" if self._rewarded else "-"
        eta = (self.total - done) / rate if rate > 0 else None
        eta_text = "-" if eta is None else time.strftime("%H:%M:%S", time.gmtime(eta)).removeprefix("00:")
        bar = ""
        if self.tty:
            filled = int(20 * done / max(self.total, 1))
            bar = "[" + "#" * filled + "-" * (20 - filled) + "] "
        failed = f"  failed {self.failed}" if self.failed else ""
        return (
            f"{self.label} {bar}{done}/{self.total} {pct:3.0f}%  {rate:.2f}/s  mean reward {mean}{failed}  eta {eta_text}"
        )

    def _draw(self, now: float) -> None:
        self._last_draw = now
        try:
            if self.tty:
                self.stream.write("\r\x1b[2K" + self.text(now))
            else:
                self.stream.write(self.text(now) + "\n")
            self.stream.flush()
            self._drawn = True
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """End the line (terminal) or print the final state (plain)."""
        try:
            if self.tty and self._drawn:
                self.stream.write("\n")
            elif not self.tty and self.count and self._next_pct <= 100:
                self.stream.write(self.text() + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass
