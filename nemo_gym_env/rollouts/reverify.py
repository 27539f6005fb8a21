"""Re-verification: send every stored rollout's verify body to the current server again, no policy call.

A verifier gets fixed; the rollouts are expensive. A rollout row is the ``/verify`` reply, which
echoes its request: the task row and ``response`` (the whole episode). :func:`verify_body` takes
the verdict off (``reward``, ``reward_components``, failure fields, step-reward bookkeeping, the
``_ng_*`` keys) and what is left is sent to ``/verify`` again; the new row is the new reply with
the old row's identity (``_ng_*``, ``agent_ref``) and its step rewards, which came from the tools
and are not the verifier's. Rows are written as ``rollouts`` writes them
(:class:`~nemo_gym_env.rollouts.output.RolloutWriter`): appended and flushed one by one, a failed
verification in the failures sidecar, and ``resume`` runs only the rows the output lacks.

:func:`check_input` reads the whole input before anything starts: a line that is not a rollout
row with a verify body stops the run there, naming the line, with nothing written.
:func:`compare` reports what changed: per server, the rows whose reward moved and the mean
reward before and after.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.traits import server_traits
from nemo_gym_env.errors import ServerError, UsageError
from nemo_gym_env.protocol.defaults import RAY_WORKER_CONCURRENCY
from nemo_gym_env.protocol.keys import (
    AGENT_REF_KEY,
    FAILURE_CLASS_KEY,
    STEP_REWARD_SUM_KEY,
    STEP_REWARDS_KEY,
    VERIFY_REWARD_KEY,
)
from nemo_gym_env.rollouts.identity import legacy_key, row_identity, server_of
from nemo_gym_env.rollouts.output import RolloutWriter, scan_rollouts
from nemo_gym_env.rollouts.report import text_table

__all__ = [
    "VERDICT_KEYS",
    "Change",
    "change_table",
    "check_input",
    "compare",
    "gymnasium_servers",
    "input_servers",
    "iter_input",
    "line_ranges",
    "reverified_row",
    "reverify_rows",
    "verify_body",
]

VERDICT_KEYS = frozenset({"reward", "reward_components", "failure_kind", "failure_reason", "mask_sample",
                          STEP_REWARDS_KEY, STEP_REWARD_SUM_KEY, VERIFY_REWARD_KEY})
"""Keys of a rollout row that are the verdict (or its bookkeeping), not the verify request."""

_MAX_PROBLEMS = 5


def verify_body(row: Mapping[str, Any]) -> dict[str, Any] | str:
    """The ``/verify`` body stored in a rollout row, or why there is none (a sentence)."""
    if not isinstance(row, Mapping):
        return f"not a JSON object but {type(row).__name__}"
    response = row.get("response")
    if not isinstance(response, Mapping) or not isinstance(response.get("output"), list):
        return "no verify body: no 'response' with the episode's 'output' list"
    if not isinstance(row.get("responses_create_params"), Mapping):
        return "no verify body: no 'responses_create_params' (the task row)"
    if row_identity(row) is None and legacy_key(row) is None:
        return "no identity: no integer _ng_task_index/_ng_rollout_index (is this a rollouts file?)"
    return {k: v for k, v in row.items() if k not in VERDICT_KEYS and not k.startswith("_ng_")}


def iter_input(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of every non-blank line of a rollouts file, streamed; raises on a bad line.

    Raises:
        UsageError: a line that is not JSON (a torn last line included: nothing is guessed).
    """
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except ValueError as exc:
                raise UsageError(f"{path}:{number}: not JSON ({exc}); nothing was re-verified") from None


def check_input(path: str | Path) -> int:
    """Check every line of the input before anything is sent; returns the number of rows.

    Raises:
        UsageError: the file is missing or empty, or lines are not rollout rows with a verify
            body; the message names the lines (the first few) and how many there are.
    """
    if not Path(path).is_file():
        raise UsageError(f"rollouts file {str(path)!r} not found")
    problems: list[str] = []
    count = 0
    for number, row in iter_input(path):
        body = verify_body(row)
        if isinstance(body, str):
            problems.append(f"{path}:{number}: {body}")
        count += 1
    if problems:
        shown = "; ".join(problems[:_MAX_PROBLEMS])
        more = f" (and {len(problems) - _MAX_PROBLEMS} more)" if len(problems) > _MAX_PROBLEMS else ""
        raise UsageError(f"{len(problems)} row(s) cannot be re-verified: {shown}{more}; nothing was re-verified")
    if not count:
        raise UsageError(f"{path} holds no rollout rows")
    return count


def reverified_row(old: Mapping[str, Any], reply: Mapping[str, Any]) -> dict[str, Any]:
    """The new rollout row: the new verify reply, the old row's identity and step rewards.

    A row whose reward was the sum of its ``/verify`` reward and its step rewards stays one:
    ``reward`` is the new ``/verify`` reward plus the same step rewards.
    """
    row = dict(reply)
    for key, value in old.items():
        if key.startswith("_ng_") or key == AGENT_REF_KEY:
            row[key] = value
    if STEP_REWARDS_KEY in old:
        row[STEP_REWARDS_KEY] = old[STEP_REWARDS_KEY]
        row[STEP_REWARD_SUM_KEY] = old.get(STEP_REWARD_SUM_KEY)
        if VERIFY_REWARD_KEY in old and isinstance(old.get(STEP_REWARD_SUM_KEY), (int, float)):
            row[VERIFY_REWARD_KEY] = float(reply["reward"])
            row["reward"] = float(reply["reward"]) + float(old[STEP_REWARD_SUM_KEY])
    return row


def _failure(old: Mapping[str, Any], reason: str, url: str) -> dict[str, Any]:
    row = {k: v for k, v in old.items() if k.startswith("_ng_") or k == AGENT_REF_KEY}
    return {**row, FAILURE_CLASS_KEY: "server_error", "failure_reason": reason[:2000], "server_url": url}


async def gymnasium_servers(clients: Mapping[str, ResourcesClient]) -> set[str]:
    """The servers among ``clients`` that speak the Gymnasium protocol (``/reset`` + ``/step``, no ``/verify``).

    Their rows are not re-verified: a Gymnasium-protocol server has no ``/verify``, and its
    reward is the sum of its steps' rewards, which only playing the episode again would give.
    """
    names = list(clients)
    traits = await asyncio.gather(*(server_traits(clients[n]) for n in names), return_exceptions=True)
    return {n for n, t in zip(names, traits) if not isinstance(t, BaseException) and t.protocol == "gymnasium"}


def line_ranges(numbers: list[int]) -> str:
    """Line numbers as ranges.

    Example:
        >>> line_ranges([3, 4, 5, 9, 11, 12])
        '3-5, 9, 11-12'
    """
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


async def reverify_rows(path: str | Path, route: Callable[[Mapping[str, Any]], str], clients: Mapping[str, ResourcesClient],
                        writer: RolloutWriter, *, concurrency: int = RAY_WORKER_CONCURRENCY,
                        on_row: Callable[[Mapping[str, Any]], None] = lambda row: None,
                        skip: frozenset[str] | set[str] = frozenset()) -> None:
    """Re-verify every row of ``path`` that ``writer`` does not hold yet, ``concurrency`` at a time.

    ``route(row)`` names the row's server in ``clients``; rows of the servers in ``skip`` are
    left out (neither sent nor written). A verification the server fails (no connection, an
    HTTP error, an unusable reply) is written as a failure row, which a resume retries. Rows are
    read lazily; cancellation stops the rows in flight.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        client = clients[route(row)]
        body = verify_body(row)
        try:
            reply = await client.verify(body, {}, task_index=row.get("_ng_task_index"))
        except ServerError as exc:
            return _failure(row, str(exc), client.base_url)
        return reverified_row(row, reply)

    def written(row: Mapping[str, Any]) -> bool:
        identity = row_identity(row)
        return identity in writer.done if identity is not None else legacy_key(row) in writer.done_legacy

    pending = (row for _, row in iter_input(path) if route(row) not in skip and not written(row))
    running: set[asyncio.Task] = set()
    try:
        while True:
            while len(running) < concurrency:
                row = next(pending, None)
                if row is None:
                    break
                running.add(asyncio.create_task(one(row)))
            if not running:
                return
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                new = task.result()
                writer.write(new)
                on_row(new)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


@dataclass
class Change:
    """What re-verification changed on one server."""

    server: str
    rows: int = 0
    moved: int = 0
    """Rows whose reward is not the same number as before."""
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)

    @property
    def mean_before(self) -> float | None:
        return sum(self.before) / len(self.before) if self.before else None

    @property
    def mean_after(self) -> float | None:
        return sum(self.after) / len(self.after) if self.after else None


def _reward(row: Mapping[str, Any]) -> float | None:
    value = row.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def compare(old_path: str | Path, new_path: str | Path) -> dict[str, Change]:
    """Per server, how the re-verified rows' rewards compare with the old ones (matched by identity).

    Only rows in both files count (an interrupted run compares what it has done).
    """
    before: dict[tuple, float | None] = {}
    for _, row in iter_input(old_path):
        identity = row_identity(row) or legacy_key(row)
        if identity is not None:
            before[identity] = _reward(row)
    changes: dict[str, Change] = {}

    def keep(row: dict[str, Any]) -> None:
        identity = row_identity(row) or legacy_key(row)
        if identity is None or identity not in before:
            return
        old, new = before[identity], _reward(row)
        name = server_of(row) or identity[0] or "all"
        change = changes.setdefault(name, Change(name))
        change.rows += 1
        if old is not None:
            change.before.append(old)
        if new is not None:
            change.after.append(new)
        if old != new:
            change.moved += 1

    scan_rollouts(Path(new_path), keep)
    return dict(sorted(changes.items()))


def change_table(changes: Mapping[str, Change]) -> str:
    """The changes as a text table: one line per server, then the total when there are several."""

    def mean(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    table = [["server", "rows", "reward moved", "mean before", "mean after"]]
    for change in changes.values():
        table.append([change.server, str(change.rows), str(change.moved), mean(change.mean_before),
                      mean(change.mean_after)])
    if len(changes) > 1:
        total = Change("total")
        for change in changes.values():
            total.rows += change.rows
            total.moved += change.moved
            total.before += change.before
            total.after += change.after
        table.append(["total", str(total.rows), str(total.moved), mean(total.mean_before), mean(total.mean_after)])
    return text_table(table, numeric=True)


def input_servers(path: str | Path) -> tuple[dict[str, int], set[str]]:
    """Rows per server (``agent_ref.name``; ``""`` for rows that name none) of a checked input file, and the
    servers every one of whose rows is a played Gymnasium-protocol episode: rows that end with the game's
    ``terminated`` and ``truncated`` flags, which only ``/step`` answers give (re-verifying skips them without
    starting their servers). One pass over the file."""
    counts: dict[str, int] = defaultdict(int)
    played: dict[str, bool] = {}
    for _, row in iter_input(path):
        name = server_of(row)
        counts[name or ""] += 1
        if name:
            episode = isinstance(row.get("terminated"), bool) and isinstance(row.get("truncated"), bool)
            played[name] = played.get(name, True) and episode
    return dict(counts), {name for name, episode in played.items() if episode}
