"""The rollout files a viewer shows: their indexes, followed while they grow, and the queries on them.

Each file named on the command line comes with its failures sidecar (``<stem>_failures.jsonl``,
:func:`~nemo_gym_env.rollouts.failures_path`); both are indexed, and followed by a thread that
reads what is appended. Queries (filter, sort, page) run on the indexes' columns; only a
free-text search reads rows, one sequential pass over the file per new search, remembered
until the file changes.

Example:
    >>> library = RolloutLibrary(["results/rollouts.jsonl"])          # doctest: +SKIP
    >>> library.start()                                                # doctest: +SKIP
    >>> page = library.query(Query(outcome="failed", sort="reward"), offset=0, limit=50)  # doctest: +SKIP
    >>> library.close()                                                # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import RowGoneError
from nemo_gym_env.rollouts.output import failures_path
from nemo_gym_env.viewer.index import DEFAULT_MAX_ROW_BYTES, JsonlIndex

__all__ = ["COLUMNS", "OUTCOMES", "FileEntry", "Query", "RolloutLibrary", "RowRef"]

COLUMNS = ("file", "line", "server", "task", "rollout", "reward", "turns", "tool_calls", "tokens", "failure")
"""The list's columns, each one a sort key."""

OUTCOMES = ("all", "passed", "failed")
"""``passed``: a reward above 0. ``failed``: the rest (reward 0 or below, no reward, failed rollouts)."""

_CACHED_ORDERS = 8  # remembered query results
_CACHED_SEARCHES = 8  # remembered free-text searches, per file
_FOLLOW_SLICE = 4 * 1024 * 1024  # bytes indexed per lock hold: readers wait at most this long
_FILE_SHIFT = 40  # a row's key: file id above this bit, row number below
_NUMBER_MASK = (1 << _FILE_SHIFT) - 1


@dataclass(frozen=True)
class FileEntry:
    """One indexed file.

    Attributes:
        id: Its number in URLs.
        path: As given (or derived, for a sidecar).
        kind: ``"rollouts"`` or ``"failures"`` (a sidecar).
        partner: The id of its sidecar (for a rollouts file) or of its rollouts file (for a sidecar).
    """

    id: int
    path: Path
    kind: str
    partner: int | None
    index: JsonlIndex


@dataclass(frozen=True)
class RowRef:
    """Row ``number`` of file ``file``."""

    file: int
    number: int


@dataclass(frozen=True)
class Query:
    """A filter and an order of the list.

    Attributes:
        server: Only rows of this ``agent_ref.name`` ("" for rows without one).
        min_reward: Only rows with a reward at least this.
        max_reward: Only rows with a reward at most this.
        outcome: One of :data:`OUTCOMES`.
        text: Only rows whose line contains this text (case-insensitive).
        file: Only rows of this file id.
        sort: One of :data:`COLUMNS`.
        descending: Reverse the order (blanks stay last).
    """

    server: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    outcome: str = "all"
    text: str = ""
    file: int | None = None
    sort: str = "line"
    descending: bool = False


class RolloutLibrary:
    """Indexes of the given rollout files and their sidecars; see the module docstring.

    Args:
        paths: Rollout JSONL files (missing ones are indexed once they appear). A path that is
            itself a sidecar is shown as one.
        max_row_bytes: Longest line parsed.
        follow_interval_s: How often the follower thread looks for appended rows.
    """

    def __init__(self, paths: Sequence[str | Path], *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
                 follow_interval_s: float = 0.5):
        self.lock = threading.RLock()
        self.files: list[FileEntry] = []
        seen: set[Path] = set()
        for path in paths:
            path = Path(path)
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            if path.name.endswith("_failures.jsonl"):
                self._add(path, "failures", None, max_row_bytes)
                continue
            sidecar = failures_path(path)
            main_id = len(self.files)
            self._add(path, "rollouts", main_id + 1 if sidecar.resolve() not in seen else None, max_row_bytes)
            if sidecar.resolve() not in seen:
                seen.add(sidecar.resolve())
                self._add(sidecar, "failures", main_id, max_row_bytes)
        self.follow_interval_s = follow_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._searches: OrderedDict[tuple, tuple[int, bytearray]] = OrderedDict()
        self._orders: OrderedDict[tuple, array] = OrderedDict()

    def _add(self, path: Path, kind: str, partner: int | None, max_row_bytes: int) -> None:
        self.files.append(FileEntry(len(self.files), path, kind, partner, JsonlIndex(path, max_row_bytes=max_row_bytes)))

    # ---- following ----------------------------------------------------------------------------

    def refresh(self, max_bytes: int | None = None) -> bool:
        """Index what was appended to every file (at most ``max_bytes`` of each); whether anything changed."""
        changed = False
        for entry in self.files:
            with self.lock:
                changed |= entry.index.refresh(max_bytes)
        return changed

    @property
    def complete(self) -> bool:
        """Whether every file is indexed to its end (as of the last refresh)."""
        return all(entry.index.complete for entry in self.files)

    def start(self) -> None:
        """Start the follower thread (it indexes the files in slices, then polls for growth)."""
        self._thread = threading.Thread(target=self._follow, name="nemo-gym-env-view-follow", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            self.refresh(_FOLLOW_SLICE)
            # Between slices, a pause long enough for a waiting request to take the lock (a released
            # lock is not handed to a waiter: this thread would take it straight back).
            self._stop.wait(self.follow_interval_s if self.complete else 0.005)

    def close(self) -> None:
        """Stop following."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def generation(self) -> tuple[int, ...]:
        """Changes whenever any file's rows change."""
        return tuple(entry.index.generation for entry in self.files)

    # ---- queries ----------------------------------------------------------------------------

    def entry(self, file: int) -> FileEntry:
        """The file with this id; :class:`IndexError` if none."""
        if not 0 <= file < len(self.files):
            raise IndexError(f"no file {file}")
        return self.files[file]

    def servers(self) -> list[str]:
        """Every ``agent_ref.name`` seen ("" for rows without one), sorted."""
        with self.lock:
            return sorted({name or "" for entry in self.files for name in entry.index.servers})

    def query(self, query: Query) -> array:
        """The rows matching ``query``, in its order, as :meth:`ref` keys (remembered until a file changes).

        Keys are 8 bytes a row: a cached order of 100,000 rows costs 800 kB.
        """
        if query.sort not in COLUMNS:
            raise ValueError(f"sort must be one of {', '.join(COLUMNS)}, got {query.sort!r}")
        if query.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, got {query.outcome!r}")
        with self.lock:
            key = (self.generation(), query)
            found = self._orders.get(key)
            if found is None:
                found = self._orders[key] = self._run(query)
                while len(self._orders) > _CACHED_ORDERS:
                    self._orders.popitem(last=False)
            else:
                self._orders.move_to_end(key)
            return found

    def page(self, query: Query, offset: int, limit: int) -> tuple[int, list[RowRef]]:
        """``(rows matching, the rows offset..offset+limit)`` of ``query``."""
        with self.lock:
            found = self.query(query)
            return len(found), [self.ref(key) for key in found[offset:offset + limit]]

    @staticmethod
    def ref(key: int) -> RowRef:
        """The row a key of :meth:`query` stands for."""
        return RowRef(key >> _FILE_SHIFT, key & _NUMBER_MASK)

    def _run(self, query: Query) -> array:
        keys: list[int] = []
        for entry in self.files:
            if query.file is not None and entry.id != query.file:
                continue
            index = entry.index
            matched = self._search(entry, query.text) if query.text else None
            keep_server = None
            if query.server is not None:
                keep_server = {i for i, name in enumerate(index.servers) if (name or "") == query.server}
            failures = entry.kind == "failures"
            base = entry.id << _FILE_SHIFT
            for number in range(len(index)):
                if keep_server is not None and index.server_ids[number] not in keep_server:
                    continue
                if matched is not None and not matched[number]:
                    continue
                reward = index.rewards[number]
                has_reward = not failures and not math.isnan(reward)
                if query.min_reward is not None and not (has_reward and reward >= query.min_reward):
                    continue
                if query.max_reward is not None and not (has_reward and reward <= query.max_reward):
                    continue
                passed = has_reward and reward > 0
                if (query.outcome == "passed" and not passed) or (query.outcome == "failed" and passed):
                    continue
                keys.append(base | number)
        if query.sort != "line" or query.descending:
            keys = self._sorted(keys, query.sort, query.descending)
        return array("q", keys)

    def _sorted(self, keys: list[int], column: str, descending: bool) -> list[int]:
        """Keys ordered by a column; rows without a value last, whichever the direction."""
        value = self._column(column)
        present, blanks = [], []
        for key in keys:
            got = value(key >> _FILE_SHIFT, key & _NUMBER_MASK)
            (blanks if got is None else present).append((got, key))
        present.sort(reverse=descending)
        return [key for _, key in present] + [key for _, key in blanks]

    def _column(self, column: str) -> Callable[[int, int], Any]:
        files = self.files
        if column in ("file", "line"):
            return lambda file, number: (file, files[file].index.lines[number])
        if column == "server":
            return lambda file, number: files[file].index.servers[files[file].index.server_ids[number]]
        if column == "failure":
            return lambda file, number: files[file].index.failures.get(number)
        if column == "reward":
            return lambda file, number: (None if math.isnan(r := files[file].index.rewards[number]) else r)
        return lambda file, number: files[file].index.int_value(column, number)

    def _search(self, entry: FileEntry, text: str) -> bytearray:
        """A byte per row of the file: 1 where the line holds ``text``, case-insensitively (as typed, or as
        JSON escapes it). Rows appended since the last search of the same text are the only ones read."""
        key = (entry.id, text.casefold())
        index = entry.index
        epoch, hits = self._searches.get(key, (None, bytearray()))
        if epoch != index.epoch:
            hits = bytearray()
        # The last row seen may have been an unfinished last line that has changed since: read it again.
        start = max(0, min(len(hits), len(index)) - 1)
        del hits[start:]
        needles = _needles(text)
        try:
            for _, raw in index.iter_raw(range(start, len(index))):
                line = _searchable(raw)
                hits.append(any(needle in line for needle in needles))
        except RowGoneError:  # removed since the last refresh: nothing matches until it is indexed again
            hits.extend(bytes(len(index) - len(hits)))
            return hits
        self._searches[key] = (index.epoch, hits)
        self._searches.move_to_end(key)
        while len(self._searches) > _CACHED_SEARCHES:
            self._searches.popitem(last=False)
        return hits

    # ---- what the page lists ----------------------------------------------------------------

    def list_row(self, ref: RowRef) -> dict[str, Any]:
        """The list columns of one row, as the API sends them."""
        entry = self.files[ref.file]
        stats = entry.index.stats(ref.number)
        return {"file": ref.file, "number": ref.number, "kind": entry.kind, "line": entry.index.lines[ref.number],
                **asdict(stats)}

    def group(self, file: int, server: str | None, task: int) -> list[RowRef]:
        """The rollouts of one task of one server, by rollout index, then its failed rollouts.

        A failed rollout that has an output row too (``--resume`` retried it) is left out, as
        :func:`~nemo_gym_env.rollouts.summarize` leaves it out of the failures.
        """
        entry = self.entry(file)
        main = entry if entry.kind == "rollouts" or entry.partner is None else self.files[entry.partner]
        sidecar = self.files[main.partner] if main.kind == "rollouts" and main.partner is not None else None
        with self.lock:
            rows = self._task_rows(main, server, task)
            done = {main.index.int_value("rollout", ref.number) for ref in rows}
            failed = [] if sidecar is None else [
                ref for ref in self._task_rows(sidecar, server, task)
                if sidecar.index.int_value("rollout", ref.number) not in done]
        return rows + failed

    def _task_rows(self, entry: FileEntry, server: str | None, task: int) -> list[RowRef]:
        index = entry.index
        refs = [RowRef(entry.id, number) for number in range(len(index))
                if index.tasks[number] == task and (index.servers[index.server_ids[number]] or "") == (server or "")]
        refs.sort(key=lambda ref: (index.int_value("rollout", ref.number) is None,
                                   index.int_value("rollout", ref.number) or 0, ref.number))
        return refs

    def errors(self) -> list[dict[str, Any]]:
        """Every recorded line error, file by file."""
        with self.lock:
            return [{"file": entry.id, "path": str(entry.path), **asdict(error)}
                    for entry in self.files for error in entry.index.errors]

    def status(self) -> dict[str, Any]:
        """Per file: its size, rows, errors and how far it is indexed."""
        with self.lock:
            return {
                "generation": list(self.generation()),
                "complete": self.complete,
                "files": [
                    {
                        "id": entry.id,
                        "path": str(entry.path),
                        "kind": entry.kind,
                        "partner": entry.partner,
                        "exists": entry.path.exists(),
                        "size": entry.index.size,
                        "indexed_bytes": entry.index.indexed_bytes,
                        "rows": len(entry.index),
                        "errors": entry.index.error_count,
                        "pending_bytes": entry.index.pending_bytes,
                        "complete": entry.index.complete,
                    }
                    for entry in self.files
                ],
            }


def _needles(text: str) -> set[str]:
    """``text`` as a person typed it, and as JSON writes it inside a string (quotes, newlines escaped)."""
    return {text.casefold(), json.dumps(text, ensure_ascii=False)[1:-1].casefold()}


def _searchable(raw: bytes) -> str:
    """A line as searched: casefolded, with ``\\uXXXX`` escapes written out (``É`` is ``\\u00c9`` in a
    file written with ``ensure_ascii``, and casefolding the escape would not find ``é``)."""
    text = raw.decode("utf-8", "replace")
    if "\\u" in text:
        try:
            text = json.dumps(json.loads(text), ensure_ascii=False)
        except (ValueError, RecursionError):
            pass
    return text.casefold()

