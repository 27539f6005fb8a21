"""What makes a rollout row the one it is: the server it played on, the task, and which repeat.

A row's identity is ``(server, task key, rollout index)``. The task key is a digest of the
task row's content (its JSON with sorted keys, bookkeeping ``_ng_*`` fields left out), so it
does not change when the input file is reordered, filtered with ``--limit``, or run together
with other servers; two identical rows of one dataset are told apart by how many identical
rows came before them (``<digest>.1``, ``<digest>.2``, ...). The server is the row's
``agent_ref.name``: the name the run gave it.

``--resume`` runs exactly the identities missing from the output file. Rows written before
task keys existed are matched by ``(server, task index, rollout index)`` instead.

Example:
    >>> rows = [{"responses_create_params": {"input": "a"}}, {"responses_create_params": {"input": "a"}}]
    >>> keys = task_keys(rows)
    >>> keys[1] == keys[0] + ".1"
    True
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from nemo_gym_env.protocol.keys import AGENT_REF_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY, TASK_KEY_KEY

__all__ = ["RowKey", "legacy_key", "row_identity", "server_of", "stamp", "task_key", "task_keys"]

RowKey = tuple[str, str, int]
"""``(server, task key, rollout index)``."""

DIGEST_CHARS = 16
"""Hex digits of the SHA-256 digest kept in a task key (64 bits: no collision in any real dataset)."""


def task_key(row: Mapping[str, Any]) -> str:
    """The digest of one task row's content (without ``_ng_*`` bookkeeping fields)."""
    content = {k: v for k, v in row.items() if not str(k).startswith("_ng_")}
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]


def task_keys(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The task key of each row, identical rows told apart by their occurrence (``<digest>.<n>``)."""
    seen: dict[str, int] = {}
    keys = []
    for row in rows:
        digest = task_key(row)
        count = seen.get(digest, 0)
        seen[digest] = count + 1
        keys.append(digest if count == 0 else f"{digest}.{count}")
    return keys


def server_of(row: Mapping[str, Any]) -> str | None:
    """The server (or agent) a row names in ``agent_ref.name``; None when it names none."""
    ref = row.get(AGENT_REF_KEY)
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) and name else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def row_identity(row: Any) -> RowKey | None:
    """``(server, task key, rollout index)`` of a rollout row; None when it lacks any of them."""
    if not isinstance(row, Mapping):
        return None
    key, rollout = row.get(TASK_KEY_KEY), _int(row.get(ROLLOUT_INDEX_KEY))
    if not isinstance(key, str) or rollout is None:
        return None
    return server_of(row) or "", key, rollout


def legacy_key(row: Any) -> tuple[str, int, int] | None:
    """``(server, task index, rollout index)``: how rows without a task key are matched."""
    if not isinstance(row, Mapping):
        return None
    task, rollout = _int(row.get(TASK_INDEX_KEY)), _int(row.get(ROLLOUT_INDEX_KEY))
    if task is None or rollout is None:
        return None
    return server_of(row) or "", task, rollout


def stamp(row: dict[str, Any], *, task_index: int, key: str, rollout_index: int,
          agent_ref: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Give a rollout row (an episode's verdict, or a failure) its identity, in place, and return it:
    the task index, the task key, the rollout index, and ``agent_ref`` when the row has none.
    Every writer of rollout rows stamps them here (the rollouts command, Ray collection, the play page).

    Example:
        >>> stamp({"reward": 1.0}, task_index=2, key="ab12", rollout_index=0,
        ...       agent_ref={"type": "resources_servers", "name": "math"})["agent_ref"]["name"]
        'math'
    """
    row[TASK_INDEX_KEY] = task_index
    row[TASK_KEY_KEY] = key
    row[ROLLOUT_INDEX_KEY] = rollout_index
    if AGENT_REF_KEY not in row and agent_ref is not None:
        row[AGENT_REF_KEY] = dict(agent_ref)
    return row
