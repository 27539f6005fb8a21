"""Rollout collection: tasks through a policy against resources servers, one JSONL row per rollout.

The library behind ``nemo-gym-env rollouts``, usable from scripts::

    import asyncio
    from nemo_gym_env.policies import ScriptedPolicy
    from nemo_gym_env.rollouts import RolloutWriter, collect

    async def main(rows, url):
        with RolloutWriter("results/rollouts.jsonl", resume=True) as out:
            async for row in collect(rows, ScriptedPolicy("example_multi_step"), url,
                                     num_repeats=4, concurrency=8, skip=out.done):
                out.write(row)

Output rows are NeMo Gym's: the ``/verify`` reply (the task row, the whole episode as
``response``, ``reward`` and metrics) plus ``_ng_task_index`` and ``_ng_rollout_index``.
A rollout whose policy or server fails (refused, timed out, garbage) is not an output row:
it is yielded with ``_ng_failure_class`` and ``failure_reason`` and :class:`RolloutWriter`
puts it in the ``<output stem>_failures.jsonl`` sidecar, as NeMo Gym does, so that
``--resume`` retries it. Rows are appended and flushed one by one (fsync every few seconds):
a kill -9 loses only the rollouts in flight, and :class:`RolloutWriter` drops the torn last
line such a kill can leave.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from .actions import ActionError, normalize_action
from .client import ResourcesClient, ServerError
from .config import REDACTED, redact
from .episode import Episode
from .metrics import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, aggregate_metrics, numeric_fields
from .policies.base import Policy, PolicyRequest

__all__ = [
    "FAILURE_CLASS_KEY",
    "Progress",
    "RolloutFileError",
    "RolloutJob",
    "RolloutWriter",
    "apply_sampling",
    "collect",
    "collect_jobs",
    "failures_path",
    "is_failure",
    "metrics_path",
    "metrics_table",
    "read_rollouts",
    "run_rollout",
    "summarize",
]

FAILURE_CLASS_KEY = "_ng_failure_class"
"""Marks a failed rollout (NeMo Gym's sidecar key); its value says whose fault:
``server_error``, ``policy_error`` or ``policy_timeout``."""

AGENT_REF_KEY = "agent_ref"


class RolloutFileError(ValueError):
    """An existing output file that cannot be resumed (a damaged line that is not the last)."""


def failures_path(output: str | Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_failures.jsonl`` (NeMo Gym's sidecar name)."""
    output = Path(output)
    return output.with_name(output.stem + "_failures.jsonl")


def metrics_path(output: str | Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_metrics.json``."""
    output = Path(output)
    return output.with_name(output.stem + "_metrics.json")


def is_failure(row: Mapping[str, Any]) -> bool:
    """Whether a yielded row is a failed rollout (goes to the failures sidecar)."""
    return row.get(FAILURE_CLASS_KEY) is not None


def apply_sampling(row: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The row with sampling overrides merged into ``responses_create_params`` (NeMo Gym's semantics).

    Example:
        >>> apply_sampling({"responses_create_params": {"input": "hi", "temperature": 1.0}}, {"temperature": 0.2})
        {'responses_create_params': {'input': 'hi', 'temperature': 0.2}}
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if not overrides:
        return row
    return {**row, "responses_create_params": {**row["responses_create_params"], **overrides}}


# ---- one rollout -------------------------------------------------------------------------------


@dataclass
class RolloutJob:
    """One rollout to run: a task row, its indices, where and with what.

    Attributes:
        row: The task row (sampling overrides already applied).
        task_index: ``_ng_task_index`` of the output row.
        rollout_index: ``_ng_rollout_index`` of the output row.
        client: The resources server's client.
        policy: The policy playing the model.
        server: The server's name, recorded as ``agent_ref`` when the row has none.
    """

    row: dict[str, Any]
    task_index: int
    rollout_index: int
    client: ResourcesClient
    policy: Policy
    server: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        """``(task_index, rollout_index)``."""
        return self.task_index, self.rollout_index


def _stamp(job: RolloutJob, row: dict[str, Any]) -> dict[str, Any]:
    row[TASK_INDEX_KEY] = job.task_index
    row[ROLLOUT_INDEX_KEY] = job.rollout_index
    if AGENT_REF_KEY not in row:
        ref = job.row.get(AGENT_REF_KEY)
        if ref is None and job.server is not None:
            ref = {"type": "resources_servers", "name": job.server}
        if ref is not None:
            row[AGENT_REF_KEY] = ref
    return row


def _failure(job: RolloutJob, kind: str, reason: str) -> dict[str, Any]:
    return _stamp(job, {FAILURE_CLASS_KEY: kind, "failure_reason": reason[:2000], "server_url": job.client.base_url})


async def run_rollout(job: RolloutJob, *, max_steps: int = 16, turn_timeout_s: float | None = None) -> dict[str, Any]:
    """Play one episode: seed the session, alternate policy turns and tool calls, verify.

    Never raises for a failing policy or server: returns a failure row instead (see
    :data:`FAILURE_CLASS_KEY`). Cancellation propagates.
    """
    episode = Episode(job.client, job.row, job.task_index, max_steps)
    try:
        observation, info = await episode.start()
    except ServerError as exc:
        return _failure(job, "server_error", str(exc))
    sampling = info["sampling"]
    while not episode.done:
        request = PolicyRequest(
            input=observation, history=list(episode.trajectory), tools=episode.tools, sampling=dict(sampling),
            row=job.row,
        )
        where = f"policy {job.policy.name!r} (task {job.task_index}, rollout {job.rollout_index}, turn {episode.turn})"
        try:
            if turn_timeout_s is None:
                turn = await job.policy.generate(request)
            else:
                turn = await asyncio.wait_for(job.policy.generate(request), turn_timeout_s)
            items = normalize_action(turn.action(), turn=episode.turn)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            return _failure(job, "policy_timeout", f"{where}: no answer within {turn_timeout_s:g} s")
        except ActionError as exc:
            return _failure(job, "policy_error", f"{where} returned an invalid turn: {exc}")
        except Exception as exc:  # noqa: BLE001 - a failing policy fails this rollout, not the run
            return _failure(job, "policy_error", f"{where}: {type(exc).__name__}: {exc}")
        await episode.play(items)
    if episode.error is not None or episode.last_verify is None:
        return _failure(job, "server_error", str(episode.error or "the episode ended without a verify reply"))
    return _stamp(job, dict(episode.last_verify))


async def collect_jobs(
    jobs: Iterable[RolloutJob],
    *,
    concurrency: int = 8,
    max_steps: int = 16,
    turn_timeout_s: float | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Run jobs concurrently on the running loop, at most ``concurrency`` at a time; yield rows as they finish.

    Jobs are drawn from ``jobs`` lazily, so a huge dataset is never materialised as tasks.
    Closing the iterator (or cancelling its consumer) cancels the rollouts in flight.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    pending = iter(jobs)
    running: set[asyncio.Task] = set()

    def fill() -> None:
        while len(running) < concurrency:
            job = next(pending, None)
            if job is None:
                return
            running.add(asyncio.create_task(run_rollout(job, max_steps=max_steps, turn_timeout_s=turn_timeout_s)))

    fill()
    try:
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            running.difference_update(done)
            fill()  # refill before yielding: a slow consumer does not idle the window
            for task in done:
                yield task.result()
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


async def collect(
    rows: Sequence[dict[str, Any]],
    policy: Policy,
    server_url: str,
    *,
    num_repeats: int = 1,
    concurrency: int = 8,
    max_steps: int = 16,
    sampling: Mapping[str, Any] | None = None,
    skip: Iterable[tuple[int, int]] = (),
    request_timeout_s: float = 120.0,
    turn_timeout_s: float | None = None,
    server_name: str | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Roll out every row ``num_repeats`` times against one server; yield output (or failure) rows.

    Args:
        rows: Task rows; a row's ``_ng_task_index`` is kept, otherwise its position is used.
        policy: Plays the model.
        server_url: The resources server.
        num_repeats: Rollouts per task (``_ng_rollout_index`` 0..n-1).
        concurrency: Rollouts in flight at once.
        max_steps: Model turns before an episode is verified anyway.
        sampling: Overrides of ``responses_create_params`` (``temperature``, ``top_p``, ``max_output_tokens``).
        skip: ``(task_index, rollout_index)`` pairs already done (``RolloutWriter.done`` when resuming).
        request_timeout_s: Timeout of each server request.
        turn_timeout_s: Timeout of each policy turn (None: the policy's own).
        server_name: Recorded as ``agent_ref`` on rows without one.

    Yields:
        Rows in completion order; :func:`is_failure` tells failures apart.
    """
    client = ResourcesClient(server_url, timeout_s=request_timeout_s, verify_timeout_s=request_timeout_s)
    done = set(skip)

    def jobs() -> Iterable[RolloutJob]:
        for position, row in enumerate(rows):
            task_index = int(row.get(TASK_INDEX_KEY, position))
            prepared = apply_sampling(row, sampling)
            for rollout_index in range(num_repeats):
                if (task_index, rollout_index) not in done:
                    yield RolloutJob(prepared, task_index, rollout_index, client, policy, server_name)

    async for row in collect_jobs(jobs(), concurrency=concurrency, max_steps=max_steps, turn_timeout_s=turn_timeout_s):
        yield row


# ---- the output file ---------------------------------------------------------------------------


def _row_key(row: Any) -> tuple[int, int] | None:
    if not isinstance(row, dict):
        return None
    task, rollout = row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY)
    if isinstance(task, bool) or isinstance(rollout, bool) or not isinstance(task, int) or not isinstance(rollout, int):
        return None
    return task, rollout


def _scan(path: Path, keep: Callable[[dict[str, Any]], None]) -> tuple[int, int]:
    """Stream a rollouts file, passing each row to ``keep``; returns (end of the valid part, file size)."""
    offset, number = 0, 0
    damaged: tuple[int, int] | None = None  # (line number, offset) of a bad line that may be the torn last one
    with open(path, "rb") as handle:
        for line in handle:
            number += 1
            if damaged is not None and line.strip():
                raise RolloutFileError(
                    f"{path}:{damaged[0]}: not JSON; this line is not a rollout row. Fix or remove it, or start "
                    "over without --resume."
                )
            if not line.endswith(b"\n"):  # the write was cut short, whatever it holds
                return offset, offset + len(line)
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    damaged = (number, offset)
                    offset += len(line)
                    continue
                if _row_key(row) is None:
                    raise RolloutFileError(
                        f"{path}:{number}: has no integer {TASK_INDEX_KEY}/{ROLLOUT_INDEX_KEY}; this line is not "
                        "a rollout row. Fix or remove it, or start over without --resume."
                    )
                keep(row)
            offset += len(line)
    if damaged is not None:  # a damaged last line: torn as well
        return damaged[1], offset
    return offset, offset


def read_rollouts(path: str | Path, *, repair: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The rows of a rollouts file and the size of a torn last line (0 if none).

    A last line without its newline, or not valid JSON, is what a kill mid-write leaves: it
    is not returned, and with ``repair=True`` it is cut off the file. The file is streamed.

    Raises:
        RolloutFileError: A line other than the last is not a JSON rollout row.
    """
    rows: list[dict[str, Any]] = []
    good, size = _scan(Path(path), rows.append)
    if size > good and repair:
        _truncate(Path(path), good)
    return rows, size - good


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)
        os.fsync(handle.fileno())


class RolloutWriter:
    """Appends output rows (and failures to the sidecar), flushed per row, fsynced periodically.

    Args:
        path: The output JSONL; its folder is created.
        resume: Keep the rows already there (their keys are in :attr:`done`), cutting a torn
            last line. Otherwise the output and its failures sidecar start empty.
        fsync_interval_s: Longest time between fsyncs (every row is flushed at once).
        secrets: Strings that must never be written (API keys): replaced in failure reasons.

    Attributes:
        done: ``(task_index, rollout_index)`` of every successful row in the file.
        resumed_rows: Rows found in the file when resuming.
        torn_bytes: Size of the torn last line that was cut off (0 if none).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        resume: bool = False,
        fsync_interval_s: float = 2.0,
        secrets: Iterable[str] = (),
    ):
        self.path = Path(path)
        self.failures_path = failures_path(self.path)
        self.fsync_interval_s = fsync_interval_s
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self.done: set[tuple[int, int]] = set()
        self.resumed_rows = 0
        self.torn_bytes = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            good, size = _scan(self.path, lambda row: self.done.add(_row_key(row)))
            if size > good:
                _truncate(self.path, good)
            self.torn_bytes = size - good
            self.resumed_rows = len(self.done)
        elif not resume:
            self.path.write_bytes(b"")
            self.failures_path.unlink(missing_ok=True)
        self._out: IO[bytes] | None = open(self.path, "ab")  # noqa: SIM115 - held until close()
        self._failures: IO[bytes] | None = None
        self._last_sync = time.monotonic()
        self.written = 0
        self.failed = 0

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one yielded row: an output row, or a failure to the sidecar."""
        if self._out is None:
            raise ValueError("this RolloutWriter is closed")
        if is_failure(row):
            row = {**row, "failure_reason": self._clean(str(row.get("failure_reason", "")))}
            if self._failures is None:
                self._failures = open(self.failures_path, "ab")  # noqa: SIM115 - held until close()
            handle = self._failures
            self.failed += 1
        else:
            handle = self._out
            self.done.add(_row_key(row))
            self.written += 1
        handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
        handle.flush()
        if time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self.sync()

    def sync(self) -> None:
        """fsync both files."""
        for handle in (self._out, self._failures):
            if handle is not None:
                handle.flush()
                os.fsync(handle.fileno())
        self._last_sync = time.monotonic()

    def close(self) -> None:
        """fsync and close; safe to call twice."""
        if self._out is None:
            return
        self.sync()
        for handle in (self._out, self._failures):
            if handle is not None:
                handle.close()
        self._out = self._failures = None

    def _clean(self, text: str) -> str:
        text = redact(text)
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- metrics -----------------------------------------------------------------------------------


def _agent_name(row: Mapping[str, Any]) -> str | None:
    ref = row.get(AGENT_REF_KEY)
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def _server_of(row: Mapping[str, Any]) -> str:
    return _agent_name(row) or "all"


def route_row(row: Mapping[str, Any], servers: Iterable[str], routes: Mapping[str, str] | None = None) -> str:
    """The server a row plays on: the one its ``agent_ref.name`` names, or the only one.

    ``routes`` maps NeMo Gym agent names to server names (a row from a NeMo Gym dataset names
    its agent, whose config names the resources server).

    Raises:
        ValueError: several servers and the row names none of them.
    """
    names = list(servers)
    wanted = _agent_name(row)
    wanted = (routes or {}).get(wanted, wanted) if wanted is not None else None
    if wanted in names:
        return wanted
    if len(names) == 1:
        return names[0]
    if wanted is None:
        raise ValueError(f"no agent_ref.name to pick one of the servers ({', '.join(names)})")
    raise ValueError(f"agent_ref.name is {wanted!r}, which names none of the servers ({', '.join(names)})")


def summarize(output: str | Path) -> dict[str, Any]:
    """Aggregate metrics of a rollouts file, overall and per server (``agent_ref.name``).

    Failures still standing (in the sidecar, with no output row of the same key) are counted
    as ``num_failed``. The result is what ``<output stem>_metrics.json`` holds.
    """
    output = Path(output)
    slim: dict[str, list[dict[str, Any]]] = defaultdict(list)
    keys = set()

    def keep(row: dict[str, Any]) -> None:  # only what the metrics need: a huge file never sits in memory
        keys.add(_row_key(row))
        slim[_server_of(row)].append({**numeric_fields(row), TASK_INDEX_KEY: row[TASK_INDEX_KEY]})

    if output.exists():
        _scan(output, keep)
    failed: dict[str, set] = defaultdict(set)
    sidecar = failures_path(output)
    if sidecar.exists():
        with open(sidecar, encoding="utf-8", errors="replace") as lines:
            failures = [line for line in lines if line.strip()]
        for line in failures:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            key = _row_key(row)
            if key is not None and key not in keys:
                failed[_server_of(row)].add(key)
    everything = [r for group in slim.values() for r in group]
    summary: dict[str, Any] = {
        "output": str(output),
        "num_rollouts": len(everything),
        "num_failed": sum(len(v) for v in failed.values()),
        **aggregate_metrics(everything).model_dump(),
        "per_server": {},
    }
    for name in sorted(set(slim) | set(failed)):
        metrics = aggregate_metrics(slim.get(name, []))
        summary["per_server"][name] = {
            "num_rollouts": len(slim.get(name, [])),
            "num_failed": len(failed.get(name, ())),
            "agent_metrics": metrics.agent_metrics,
            "key_metrics": metrics.key_metrics,
        }
    return summary


def metrics_table(summary: Mapping[str, Any]) -> str:
    """The summary as a text table: one line per server, then the total."""

    def line(name: str, rollouts: int, failed: int, agent: Mapping[str, Any]) -> list[str]:
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
            "-" if k is None else f"{agent[f'pass@{k}/reward']:.1f} (k={k})",
        ]

    table = [["server", "tasks", "rollouts", "failed", "mean/reward", "pass@1 %", "pass@k %"]]
    per_server = summary.get("per_server", {})
    for name, entry in per_server.items():
        table.append(line(name, entry["num_rollouts"], entry["num_failed"], entry["agent_metrics"]))
    if len(per_server) != 1:
        table.append(line("total", summary["num_rollouts"], summary["num_failed"], summary["agent_metrics"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    out = []
    for number, row in enumerate(table):
        out.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if number == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# ---- progress ----------------------------------------------------------------------------------


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
        elif isinstance(row.get("reward"), (int, float)):
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
