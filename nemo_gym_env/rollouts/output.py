"""The rollouts file: rows appended and flushed one by one, a failures sidecar, resumable after a kill.

Output rows are NeMo Gym's: the ``/verify`` reply plus ``_ng_task_index`` and
``_ng_rollout_index``. A failed rollout goes to the ``<output stem>_failures.jsonl`` sidecar,
as NeMo Gym does, so that ``--resume`` retries it; so does a ``/verify`` reply that judged
nothing (:mod:`~nemo_gym_env.protocol.failures`), which is never written as a row with reward 0.
The sidecar holds what is still failed: when a resume is opened and when a writer closes, it
keeps the last failure of each rollout the output lacks and drops the rest. Rows are appended
and flushed one by one (fsync every few seconds): a kill -9 loses only the rollouts in flight,
and :class:`RolloutWriter` drops the torn last line such a kill can leave.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from nemo_gym_env.errors import RolloutFileError
from nemo_gym_env.protocol.failures import verdict_failure
from nemo_gym_env.protocol.keys import FAILURE_CLASS_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY
from nemo_gym_env.rollouts.identity import RowKey, legacy_key, row_identity
from nemo_gym_env.system.closing import Closing
from nemo_gym_env.system.redaction import REDACTED, redact

__all__ = [
    "RolloutFileError",
    "RolloutWriter",
    "as_failure",
    "failures_path",
    "is_failure",
    "metrics_path",
    "read_rollouts",
    "scan_rollouts",
]


def failures_path(output: str | Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_failures.jsonl`` (NeMo Gym's sidecar name)."""
    output = Path(output)
    return output.with_name(output.stem + "_failures.jsonl")


def metrics_path(output: str | Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_metrics.json``."""
    output = Path(output)
    return output.with_name(output.stem + "_metrics.json")


def is_failure(row: Mapping[str, Any]) -> bool:
    """Whether a row is a failed rollout (goes to the failures sidecar): a failure row, or a
    ``/verify`` reply that judged nothing (:func:`~nemo_gym_env.protocol.failures.verdict_failure`)."""
    return row.get(FAILURE_CLASS_KEY) is not None or verdict_failure(row) is not None


def as_failure(row: Mapping[str, Any]) -> dict[str, Any]:
    """A failed rollout as the sidecar holds it: a failure row as it is; a ``/verify`` reply that judged
    nothing becomes one (its class ``server_error``, its ``failure_kind``, the episode), without its reward."""
    if row.get(FAILURE_CLASS_KEY) is not None:
        return dict(row)
    kind, reason = verdict_failure(row) or ("unknown", "not a rollout row")
    kept = {k: v for k, v in row.items() if str(k).startswith("_ng_") or k in ("agent_ref", "response")}
    return {**kept, FAILURE_CLASS_KEY: "server_error", "failure_kind": kind, "failure_reason": reason}


def scan_rollouts(path: Path, keep: Callable[[dict[str, Any]], None]) -> tuple[int, int]:
    """Stream a rollouts file, passing each row to ``keep``; returns (end of the valid part, file size).

    Raises:
        RolloutFileError: A line other than the last is not a JSON rollout row.
    """
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
                if legacy_key(row) is None:
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
    good, size = scan_rollouts(Path(path), rows.append)
    if size > good and repair:
        _truncate(Path(path), good)
    return rows, size - good


def _identity(row: Any) -> Any:
    """A row's identity, or its legacy key when it has no task key (None: neither)."""
    return row_identity(row) or legacy_key(row)


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(size)
        os.fsync(handle.fileno())


def _cut_torn_tail(path: Path) -> int:
    """Cut a last line that has no newline (a write a kill cut short); returns the bytes cut.

    Rows are appended after it, so a torn tail left in place would swallow the next row.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = end = handle.tell()
            while end > 0:
                step = min(end, 64 * 1024)
                handle.seek(end - step)
                chunk = handle.read(step)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    end = end - step + newline + 1
                    break
                end -= step
    except FileNotFoundError:
        return 0
    if end < size:
        _truncate(path, end)
    return size - end


class RolloutWriter(Closing):
    """Appends output rows (and failures to the sidecar), flushed per row, fsynced periodically.

    Args:
        path: The output JSONL; its folder is created.
        resume: Keep the rows already there (their identities are in :attr:`done`), cutting a
            torn last line of the file and of its sidecar. Otherwise the output and its
            failures sidecar start empty.
        fsync_interval_s: Longest time between fsyncs (every row is flushed at once).
        secrets: Strings that must never be written (API keys): replaced in failure reasons.

    Attributes:
        done: ``(server, task key, rollout index)`` of every successful row in the file
            (see :mod:`~nemo_gym_env.rollouts.identity`).
        done_legacy: ``(server, task index, rollout index)`` of rows written without a task key.
        resumed_rows: Rows found in the file when resuming.
        torn_bytes: Size of the torn last line that was cut off the output (0 if none).
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
        self.done: set[RowKey] = set()
        self.done_legacy: set[tuple[str, int, int]] = set()
        self.resumed_rows = 0
        self.torn_bytes = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._failed: set[Any] = set()  # identities in the sidecar
        self._stale = False  # the sidecar holds a failure that a later row or failure replaced
        if resume and self.path.exists():
            unjudged: list[dict[str, Any]] = []
            good, size = scan_rollouts(self.path, lambda row: unjudged.append(row) if is_failure(row)
                                       else self._remember(row))
            if size > good:
                _truncate(self.path, good)
            self.torn_bytes = size - good
            self.resumed_rows = len(self.done) + len(self.done_legacy)
            _cut_torn_tail(self.failures_path)
            if unjudged:  # written as rewards by an older version: they move to the sidecar and are retried
                self._move_to_sidecar(unjudged)
            self._compact_failures()
        elif not resume:
            self.path.write_bytes(b"")
            self.failures_path.unlink(missing_ok=True)
        else:
            _cut_torn_tail(self.failures_path)
            self._compact_failures()
        self._out: IO[bytes] | None = open(self.path, "ab")  # noqa: SIM115 - held until close()
        self._failures: IO[bytes] | None = None
        self._last_sync = time.monotonic()
        self.written = 0
        self.failed = 0

    def is_done(self, server: str, task_key: str, task_index: int, rollout_index: int) -> bool:
        """Whether the file already holds this rollout (by identity, or by index for older rows)."""
        return (server, task_key, rollout_index) in self.done or (
            bool(self.done_legacy) and (server, task_index, rollout_index) in self.done_legacy)

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one yielded row: an output row, or a failure to the sidecar."""
        if self._out is None:
            raise ValueError("this RolloutWriter is closed")
        if is_failure(row):
            row = as_failure(row)
            row["failure_reason"] = self._clean(str(row.get("failure_reason", "")))
            if self._failures is None:
                self._failures = open(self.failures_path, "ab")  # noqa: SIM115 - held until close()
            handle = self._failures
            self.failed += 1
            self._note_failure(row)
        else:
            handle = self._out
            self._remember(row)
            self._stale = self._stale or _identity(row) in self._failed
            self.written += 1
        handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
        handle.flush()
        if time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self.sync()

    def _remember(self, row: Mapping[str, Any]) -> None:
        identity = row_identity(row)
        if identity is not None:
            self.done.add(identity)
        else:
            self.done_legacy.add(legacy_key(row))

    def sync(self) -> None:
        """fsync both files."""
        for handle in (self._out, self._failures):
            if handle is not None:
                handle.flush()
                os.fsync(handle.fileno())
        self._last_sync = time.monotonic()

    def close(self) -> None:
        """fsync and close, leaving in the sidecar only what is still failed; safe to call twice."""
        if self._out is None:
            return
        self.sync()
        for handle in (self._out, self._failures):
            if handle is not None:
                handle.close()
        self._out = self._failures = None
        if self._stale:
            self._compact_failures()

    def _note_failure(self, row: Mapping[str, Any]) -> None:
        identity = _identity(row)
        if identity is not None:
            self._stale = self._stale or identity in self._failed
            self._failed.add(identity)

    def _is_written(self, identity: Any) -> bool:
        return identity in self.done or identity in self.done_legacy

    def _compact_failures(self) -> None:
        """Rewrite the sidecar with the last failure of each rollout the output lacks (atomically)."""
        if not self.failures_path.exists():
            return
        lines: list[tuple[Any, bytes]] = []
        last: dict[Any, int] = {}
        with open(self.failures_path, "rb") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    identity = _identity(json.loads(line))
                except ValueError:
                    identity = None  # kept as it is: not ours to judge
                if identity is not None:
                    last[identity] = len(lines)
                lines.append((identity, line))
        kept = [line for n, (identity, line) in enumerate(lines)
                if identity is None or (last[identity] == n and not self._is_written(identity))]
        self._failed = {identity for identity, _ in lines if identity is not None and not self._is_written(identity)}
        self._stale = False
        if len(kept) == len(lines):
            return
        if not kept:
            self.failures_path.unlink()
            return
        temporary = self.failures_path.with_name(self.failures_path.name + ".tmp")
        with open(temporary, "wb") as handle:
            handle.writelines(kept)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.failures_path)

    def _move_to_sidecar(self, rows: list[dict[str, Any]]) -> None:
        """Take rows that are no judgement of the model out of the output and append them to the sidecar."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(self.path, "rb") as source, open(temporary, "wb") as target:
            for line in source:
                try:
                    row = json.loads(line) if line.strip() else None
                except ValueError:
                    row = None
                if row is None or not is_failure(row):
                    target.write(line)
            target.flush()
            os.fsync(target.fileno())
        with open(self.failures_path, "ab") as sidecar:
            for row in rows:
                sidecar.write((json.dumps(as_failure(row), ensure_ascii=False) + "\n").encode("utf-8"))
            sidecar.flush()
            os.fsync(sidecar.fileno())
        os.replace(temporary, self.path)

    def _clean(self, text: str) -> str:
        text = redact(text)
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

