"""The rollout viewer's web app: a JSON API over a :class:`RolloutLibrary`, and the page.

Routes (every reply JSON except the page; errors are ``{"error": message}``):

- ``GET /`` the page; ``GET /static/<name>`` its scripts and style
- ``GET /api/status`` files, rows, errors and indexing progress (the page polls it to follow growth)
- ``GET /api/rollouts?server=&min_reward=&max_reward=&outcome=&q=&file=&sort=&order=&offset=&limit=``
  one page of the list
- ``GET /api/rollouts/{file}/{number}`` one row, whole, with its list columns and line number
- ``GET /api/group/{file}/{task}?server=`` every rollout of one task (a GRPO group), whole rows
- ``GET /api/summary`` per file: the ``rollouts`` table and its numbers, histograms, failures by reason
- ``GET /api/errors`` the lines that are not rows, with line numbers

Every string from a file passes :class:`~nemo_gym_env.viewer.rows.Scrubber` on its way out.

Example:
    >>> library = RolloutLibrary(["results/rollouts.jsonl"])         # doctest: +SKIP
    >>> app = create_view_app(library, Scrubber(), bind_host="127.0.0.1")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi import Query as Param
from starlette.responses import JSONResponse

from nemo_gym_env.errors import PageRequestError, RowGoneError
from nemo_gym_env.viewer.library import COLUMNS, OUTCOMES, Query, RolloutLibrary, RowRef
from nemo_gym_env.viewer.rows import Scrubber
from nemo_gym_env.viewer.summary import file_summary
from nemo_gym_env.viewer.web import json_reply, page_app

__all__ = ["MAX_GROUP_ROWS", "MAX_PAGE_ROWS", "create_view_app"]

MAX_PAGE_ROWS = 500
"""Most rows one list page holds."""

MAX_GROUP_ROWS = 64
"""Most rollouts a group page shows (a GRPO group is usually 4 to 32)."""

_MAX_TEXT = 500  # longest query text or server name accepted


def create_view_app(library: RolloutLibrary, scrubber: Scrubber, *, bind_host: str = "127.0.0.1") -> FastAPI:
    """The viewer app over ``library`` (started by the caller), every string out through ``scrubber``."""
    app = page_app("nemo-gym-env view", page="index.html", scrubber=scrubber, bind_host=bind_host)

    def safe(content: Any) -> JSONResponse:
        return json_reply(content, scrubber)

    def whole_row(ref: RowRef) -> dict[str, Any]:
        entry = library.entry(ref.file)
        with library.lock:
            if not 0 <= ref.number < len(entry.index):
                raise PageRequestError(404, f"{entry.path} has no row {ref.number} ({len(entry.index)} indexed)")
            try:
                row = entry.index.row(ref.number)
            except RowGoneError as exc:
                raise PageRequestError(409, f"{exc}; reload the page") from None
            return {**library.list_row(ref), "path": str(entry.path), "row": row}

    def file_id(file: int) -> int:
        try:
            library.entry(file)
        except IndexError:
            raise PageRequestError(404, f"no file {file}: the viewer shows files 0 to {len(library.files) - 1}") from None
        return file

    @app.get("/api/status")
    def status() -> JSONResponse:
        return safe(library.status())

    @app.get("/api/rollouts")
    def rollouts(
        server: str | None = Param(None, max_length=_MAX_TEXT),
        min_reward: float | None = None,
        max_reward: float | None = None,
        outcome: str = Param("all", max_length=20),
        q: str = Param("", max_length=_MAX_TEXT),
        file: int | None = None,
        sort: str = Param("line", max_length=20),
        order: str = Param("asc", pattern="^(asc|desc)$"),
        offset: int = Param(0, ge=0),
        limit: int = Param(100, ge=1, le=MAX_PAGE_ROWS),
    ) -> JSONResponse:
        if sort not in COLUMNS:
            raise PageRequestError(422, f"sort: one of {', '.join(COLUMNS)}, not {sort[:20]!r}")
        if outcome not in OUTCOMES:
            raise PageRequestError(422, f"outcome: one of {', '.join(OUTCOMES)}, not {outcome[:20]!r}")
        query = Query(server=server, min_reward=min_reward, max_reward=max_reward, outcome=outcome, text=q.strip(),
                      file=None if file is None else file_id(file), sort=sort, descending=order == "desc")
        with library.lock:
            matched, refs = library.page(query, offset, limit)
            rows = [library.list_row(ref) for ref in refs]
            total = sum(len(entry.index) for entry in library.files)
        return safe({"rows": rows, "matched": matched, "total": total, "offset": offset, "limit": limit,
                     "servers": library.servers(), "complete": library.complete,
                     "generation": list(library.generation())})

    @app.get("/api/rollouts/{file}/{number}")
    def rollout(file: int, number: int) -> JSONResponse:
        reply = whole_row(RowRef(file_id(file), number))
        if reply["task"] is not None:
            reply["group"] = {"file": file, "task": reply["task"], "server": reply["server"] or ""}
        return safe(reply)

    @app.get("/api/group/{file}/{task}")
    def group(file: int, task: int, server: str = Param("", max_length=_MAX_TEXT)) -> JSONResponse:
        refs = library.group(file_id(file), server or None, task)
        if not refs:
            raise PageRequestError(404, f"no rollout of task {task} on server {server!r} in {library.entry(file).path}")
        rows = []
        for ref in refs[:MAX_GROUP_ROWS]:
            try:
                rows.append(whole_row(ref))
            except PageRequestError as exc:  # a row rewritten meanwhile: say so in its place
                rows.append({**library.list_row(ref), "error": exc.message})
        return safe({"file": file, "task": task, "server": server, "count": len(refs), "rows": rows})

    @app.get("/api/summary")
    def summary() -> JSONResponse:
        files = []
        with library.lock:
            for entry in library.files:
                if entry.kind != "rollouts":
                    continue
                sidecar = library.files[entry.partner].index if entry.partner is not None else None
                files.append({"file": entry.id, "path": str(entry.path), **file_summary(entry.index, sidecar)})
        return safe({"files": files, "complete": library.complete})

    @app.get("/api/errors")
    def errors() -> JSONResponse:
        return safe({"errors": library.errors(),
                     "count": sum(entry.index.error_count for entry in library.files)})

    return app
