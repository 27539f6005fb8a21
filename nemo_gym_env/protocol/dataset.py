"""Dataset rows: NeMo Gym's JSONL task format, read and checked line by line."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nemo_gym_env.errors import DatasetError
from nemo_gym_env.protocol.types import BaseRunRequest

__all__ = ["DatasetError", "RowProblem", "iter_rows", "load_rows", "check_row", "input_items", "write_rows"]


@dataclass(frozen=True)
class RowProblem:
    """Why one line of a dataset cannot be used."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def check_row(row: Any) -> str | None:
    """Why ``row`` is not a valid task row, or None when it is.

    Example:
        >>> check_row({"responses_create_params": {"input": "hi"}}) is None
        True
        >>> check_row({"prompt": "hi"})
        "missing 'responses_create_params'"
    """
    if not isinstance(row, dict):
        return f"a row must be a JSON object, got {type(row).__name__}"
    if "responses_create_params" not in row:
        return "missing 'responses_create_params'"
    try:
        BaseRunRequest.model_validate(row)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}"
    return None


def iter_rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """Yield ``(line_number, row, problem)`` for every non-blank line; ``row`` is None when invalid."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield number, None, f"not UTF-8 text: byte {exc.start + 1} of the line is {raw[exc.start]:#04x}"
                continue
            if not line.strip():
                continue
            try:
                # Without its newline: an error at the end of the line is at its last column, not
                # at "line 2, column 1".
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                yield number, None, f"not JSON: {exc.msg} at column {exc.colno}"
                continue
            problem = check_row(row)
            yield number, (row if problem is None else None), problem


def load_rows(source: str | Path | Sequence[dict[str, Any]], *, strict: bool = True) -> list[dict[str, Any]]:
    """Rows from a JSONL path or a list of dicts; invalid rows raise :class:`DatasetError` when ``strict``.

    With ``strict=False`` invalid rows are skipped (use :func:`iter_rows` to report them).
    """
    if isinstance(source, (str, Path)):
        rows, problems = [], []
        for number, row, problem in iter_rows(source):
            if problem is not None:
                problems.append(RowProblem(number, problem))
            else:
                rows.append(row)
        if problems and strict:
            raise DatasetError(str(source), problems)
        if not rows:
            raise DatasetError(str(source), problems or [RowProblem(0, "the dataset has no rows")])
        return rows
    rows = list(source)
    problems = [RowProblem(i + 1, p) for i, r in enumerate(rows) if (p := check_row(r)) is not None]
    if problems:
        raise DatasetError("<rows>", problems)
    if not rows:
        raise DatasetError("<rows>", [RowProblem(0, "the dataset has no rows")])
    return rows


def input_items(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The row's input as Responses input items; a string input becomes one user message."""
    value = row["responses_create_params"]["input"]
    if isinstance(value, str):
        return [{"role": "user", "content": value, "type": "message"}]
    return [dict(item) for item in value]


def write_rows(rows: Sequence[dict[str, Any]], out: str | Path | None = None) -> None:
    """Rows as JSONL, one per line: to the file ``out`` (its folder made), or to standard output."""
    import sys

    text = "".join(json.dumps(row) + "\n" for row in rows)
    if out is None:
        sys.stdout.write(text)
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
