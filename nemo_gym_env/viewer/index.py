"""A byte-offset index of one JSONL rollouts file, kept up to date while the file grows.

The index keeps, per row, where its line is (offset, length, line number) and its list
columns (:class:`~nemo_gym_env.viewer.rows.RowStats`) in compact arrays: about 60 bytes a
row, whatever the rows hold. A row itself is read again from the file when asked for, so a
file of 100,000 rollouts costs a few megabytes, not the file's size.

:meth:`JsonlIndex.refresh` reads only what was appended since the last call, and at most
``max_bytes`` of it per call, so a huge file is indexed in slices between which readers get
their answers. A last line without its newline is a row being written (or torn by a kill):
it is shown once it parses, and read again when the file grows. A file that shrank or was
replaced is indexed anew. Lines that are not JSON objects are recorded with their line
numbers, never fatal; a line longer than ``max_row_bytes`` is skipped without being held.

Example:
    >>> import json, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "rollouts.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write(json.dumps({"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}) + "\\n")
    ...     _ = f.write("{not json\\n")
    >>> index = JsonlIndex(path)
    >>> index.refresh()
    True
    >>> len(index), index.stats(0).reward, index.errors[0].line
    (1, 1.0, 2)
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import RowGoneError
from nemo_gym_env.viewer.rows import RowStats, row_stats

__all__ = ["DEFAULT_MAX_ROW_BYTES", "INT_COLUMNS", "JsonlIndex", "LineError", "parse_line"]

DEFAULT_MAX_ROW_BYTES = 16 * 1024 * 1024
"""Longest line the viewer parses; a longer one is listed as an error and skipped unread."""

MAX_ERRORS_KEPT = 1000
"""Errors recorded in full; past that they are only counted (a file of garbage stays small in memory)."""

INT_COLUMNS = ("task", "rollout", "turns", "tool_calls", "tokens")
"""The integer list columns, read with :meth:`JsonlIndex.int_value`."""

_MISSING_INT = -(2**63)  # an absent integer column value (task, rollout, turns, ...)
_READ_BLOCK = 1024 * 1024
_FINGERPRINT = 64  # bytes before the indexed end, compared on refresh to notice a rewritten file


@dataclass(frozen=True)
class LineError:
    """A line of the file that is not (entirely) a row.

    Attributes:
        line: 1-based line number.
        offset: Byte offset of the line.
        message: What is wrong, for a person.
        level: ``"error"`` (the line is not a row) or ``"warning"`` (it is, with a caveat).
    """

    line: int
    offset: int
    message: str
    level: str = "error"


def _parse(raw: bytes) -> tuple[Any, str | None, str | None]:
    """``(value, error, warning)`` of one line's bytes."""
    warning = None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = raw.decode("utf-8", "replace")
        warning = f"not valid UTF-8 at byte {exc.start + 1} of the line: shown with U+FFFD in its place"
    try:
        return json.loads(text), None, warning
    except json.JSONDecodeError as exc:
        return None, f"not JSON: {exc.msg} at column {exc.colno}", warning
    except RecursionError:
        return None, "not readable: JSON nested too deeply", warning
    except ValueError as exc:  # e.g. an integer longer than Python converts
        return None, f"not readable: {exc}", warning


def parse_line(raw: bytes) -> Any:
    """The JSON value of one line's bytes (invalid UTF-8 replaced); :class:`ValueError` if it is not JSON."""
    value, error, _ = _parse(raw)
    if error is not None:
        raise ValueError(error)
    return value


def _int_or_missing(value: int | None) -> int:
    # An integer beyond 64 bits (a hostile or broken row) does not fit the column: it shows as blank.
    return _MISSING_INT if value is None or not _MISSING_INT < value < 2**63 else value


def _missing_to_none(value: int) -> int | None:
    return None if value == _MISSING_INT else value


class JsonlIndex:
    """Byte offsets and list columns of the rows of one JSONL file; see the module docstring.

    Args:
        path: The file; it may not exist yet (it is indexed once it appears).
        max_row_bytes: Longest line parsed.

    Attributes:
        errors: The first :data:`MAX_ERRORS_KEPT` lines that are not rows (or rows with a caveat).
        error_count: Every such line, kept or not.
        generation: Grows whenever the rows change; a reader caching results compares it.
        epoch: Grows when the file is indexed anew (rewritten, replaced, removed): rows before
            the last one are unchanged while it stays the same.
        size: The file's size at the last refresh.
        pending_bytes: A last line without its newline that is not (yet) a row.
    """

    def __init__(self, path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES):
        self.path = Path(path)
        self.max_row_bytes = max_row_bytes
        self.generation = 0
        self.epoch = 0
        self._reset()

    def _reset(self) -> None:
        self.offsets = array("q")
        self.lengths = array("q")
        self.lines = array("q")
        self.tasks = array("q")
        self.rollouts = array("q")
        self.rewards = array("d")
        self.turns = array("q")
        self.tool_calls = array("q")
        self.tokens = array("q")
        self.server_ids = array("l")
        self.servers: list[str | None] = []
        self._server_ids: dict[str | None, int] = {}
        self.task_key_ids = array("l")
        self.task_keys: list[str | None] = []
        self._task_key_ids: dict[str | None, int] = {}
        self.failures: dict[int, str] = {}
        self.errors: list[LineError] = []
        self.error_count = 0
        self.size = 0
        self.pending_bytes = 0
        self._tail = 0  # bytes after _end already looked at: an unterminated last line
        self._end = 0  # every complete line before this offset is indexed
        self._line = 0  # lines before _end
        self._identity: tuple[int, int] | None = None
        self._fingerprint = b""
        self._provisional = False  # the last row is an unterminated last line, read again when the file grows
        self.generation += 1
        self.epoch += 1

    # ---- reading the file --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def complete(self) -> bool:
        """Whether everything in the file at the last refresh is indexed."""
        return self._end + self._tail >= self.size

    @property
    def indexed_bytes(self) -> int:
        """Bytes of the file read into the index so far."""
        return self._end

    def refresh(self, max_bytes: int | None = None) -> bool:
        """Index what was appended since the last call (at most about ``max_bytes`` of it); whether rows changed."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if self._identity is None and not len(self):
                return False
            self._reset()
            return True
        identity = (stat.st_dev, stat.st_ino)
        if identity == self._identity and stat.st_size == self.size and self.complete:
            return False
        changed = False
        if self._identity is not None and (identity != self._identity or stat.st_size < self._end or not self._same_prefix()):
            self._reset()
            changed = True
        self._identity = identity
        self.size = stat.st_size
        if self._provisional:  # the unterminated last line grew: read it again
            self._drop_last_row()
            changed = True
        with open(self.path, "rb") as handle:
            handle.seek(self._end)
            changed |= self._read(handle, max_bytes)
        self._fingerprint = self._read_fingerprint()
        if changed:
            self.generation += 1
        return changed

    def _read(self, handle: Any, max_bytes: int | None) -> bool:
        changed = False
        start = self._end
        self.pending_bytes = self._tail = 0
        while max_bytes is None or self._end - start < max_bytes:
            raw, length, oversized = self._next_line(handle)
            if not length:
                return changed
            if not raw.endswith(b"\n") and not oversized:  # the last line, not finished (or torn)
                self._tail = length
                if self._add(raw, self._end, self._line + 1, final=False):
                    self._provisional = True
                    changed = True
                else:
                    self.pending_bytes = length
                return changed
            self._line += 1
            if oversized:
                self._error(self._line, self._end, f"a line of {length / 2**20:.1f} MiB, over the viewer's limit of "
                            f"{self.max_row_bytes / 2**20:.0f} MiB (--max-row-mb): not shown")
            elif raw.strip():
                changed |= self._add(raw, self._end, self._line, final=True)
            self._end += length
        return changed

    def _next_line(self, handle: Any) -> tuple[bytes, int, bool]:
        """``(bytes, length, oversized)`` of the next line; an oversized line's bytes are not kept."""
        raw = handle.readline(self.max_row_bytes + 1)
        if len(raw) <= self.max_row_bytes or raw.endswith(b"\n"):
            return raw, len(raw), False
        length = len(raw)
        while True:
            more = handle.readline(_READ_BLOCK)
            length += len(more)
            if not more or more.endswith(b"\n"):
                return b"\n" if more else b"", length, bool(more)

    def _add(self, raw: bytes, offset: int, line: int, *, final: bool) -> bool:
        """Index one line; whether it is a row. An unfinished last line records no error."""
        value, error, warning = _parse(raw)
        if error is None and not isinstance(value, dict):
            error = f"a JSON {type(value).__name__ if value is not None else 'null'}, not a rollout row (an object)"
        if error is not None:
            if final:
                self._error(line, offset, error)
            return False
        if warning is not None and final:
            self._error(line, offset, warning, "warning")
        self._append(row_stats(value), offset, len(raw), line)
        return True

    def _append(self, stats: RowStats, offset: int, length: int, line: int) -> None:
        number = len(self.offsets)
        self.offsets.append(offset)
        self.lengths.append(length)
        self.lines.append(line)
        self.tasks.append(_int_or_missing(stats.task))
        self.rollouts.append(_int_or_missing(stats.rollout))
        self.rewards.append(float("nan") if stats.reward is None else stats.reward)
        self.turns.append(_int_or_missing(stats.turns))
        self.tool_calls.append(_int_or_missing(stats.tool_calls))
        self.tokens.append(_int_or_missing(stats.tokens))
        server = self._server_ids.get(stats.server)
        if server is None:
            server = self._server_ids[stats.server] = len(self.servers)
            self.servers.append(stats.server)
        self.server_ids.append(server)
        key = self._task_key_ids.get(stats.task_key)
        if key is None:
            key = self._task_key_ids[stats.task_key] = len(self.task_keys)
            self.task_keys.append(stats.task_key)
        self.task_key_ids.append(key)
        if stats.failure:
            self.failures[number] = stats.failure[:500]

    def _drop_last_row(self) -> None:
        for column in (self.offsets, self.lengths, self.lines, self.tasks, self.rollouts, self.rewards, self.turns,
                       self.tool_calls, self.tokens, self.server_ids, self.task_key_ids):
            column.pop()
        self.failures.pop(len(self.offsets), None)
        self._provisional = False

    def _error(self, line: int, offset: int, message: str, level: str = "error") -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(LineError(line, offset, message, level))

    def _read_fingerprint(self) -> bytes:
        if not self._end:
            return b""
        with open(self.path, "rb") as handle:
            handle.seek(max(0, self._end - _FINGERPRINT))
            return handle.read(min(self._end, _FINGERPRINT))

    def _same_prefix(self) -> bool:
        try:
            return self._read_fingerprint() == self._fingerprint
        except OSError:
            return False

    # ---- rows ------------------------------------------------------------------------------

    def stats(self, number: int) -> RowStats:
        """The list columns of row ``number``."""
        return RowStats(
            server=self.servers[self.server_ids[number]],
            task=_missing_to_none(self.tasks[number]),
            rollout=_missing_to_none(self.rollouts[number]),
            task_key=self.task_keys[self.task_key_ids[number]],
            reward=None if self.rewards[number] != self.rewards[number] else self.rewards[number],
            turns=_missing_to_none(self.turns[number]),
            tool_calls=_missing_to_none(self.tool_calls[number]),
            tokens=_missing_to_none(self.tokens[number]),
            failure=self.failures.get(number),
        )

    def int_value(self, column: str, number: int) -> int | None:
        """Row ``number``'s value in one of :data:`INT_COLUMNS` (None when the row has none)."""
        array_of = {"task": self.tasks, "rollout": self.rollouts, "turns": self.turns, "tool_calls": self.tool_calls,
                    "tokens": self.tokens}[column]
        return _missing_to_none(array_of[number])

    def raw(self, number: int) -> bytes:
        """The bytes of row ``number``'s line, read from the file now.

        Raises:
            IndexError: No such row.
            RowGoneError: The file no longer holds it there.
        """
        if not 0 <= number < len(self.offsets):
            raise IndexError(f"{self.path} has no row {number} ({len(self.offsets)} indexed)")
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offsets[number])
                raw = handle.read(self.lengths[number])
        except OSError as exc:
            raise RowGoneError(f"{self.path}: {exc.strerror or exc}") from None
        if len(raw) != self.lengths[number]:
            raise RowGoneError(f"{self.path} changed under the index (row {number} is gone)")
        return raw

    def row(self, number: int) -> dict[str, Any]:
        """Row ``number``, parsed from the file now (see :meth:`raw`)."""
        try:
            value = parse_line(self.raw(number))
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise RowGoneError(f"{self.path} changed under the index (row {number} is no longer a row)")
        return value

    def iter_raw(self, numbers: Iterable[int] | None = None) -> Iterator[tuple[int, bytes]]:
        """``(number, bytes)`` of the given rows (all by default), in file order, read sequentially.

        Raises:
            RowGoneError: The file is gone.
        """
        numbers = range(len(self.offsets)) if numbers is None else sorted(numbers)
        if not numbers:
            return
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below, after the generator's last row
        except OSError as exc:
            raise RowGoneError(f"{self.path}: {exc.strerror or exc}") from None
        with handle:
            for number in numbers:
                handle.seek(self.offsets[number])
                yield number, handle.read(self.lengths[number])
