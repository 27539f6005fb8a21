"""The tasks an env plays: its rows, and which one a reset picks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nemo_gym_env.envs.sources import ServerHandle
from nemo_gym_env.protocol.dataset import load_rows

__all__ = ["pick_task", "task_rows"]


def task_rows(handle: ServerHandle, dataset: str | Path | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The task rows an env plays: ``dataset``, or the server's own example data."""
    if dataset is None and handle.default_dataset is None:
        raise ValueError("dataset is required with base_url, or with a config whose server folder has no "
                         "data/example.jsonl: a JSONL path or a list of rows")
    return load_rows(handle.default_dataset if dataset is None else dataset)


def pick_task(rows: Sequence[dict[str, Any]], rng: np.random.Generator,
              options: dict[str, Any] | None) -> tuple[int | None, dict[str, Any]]:
    """The task of a reset: ``options["row"]``, ``options["task_index"]``, or drawn from ``rng``."""
    options = options or {}
    if "row" in options:
        return options.get("task_index"), load_rows([options["row"]])[0]
    if "task_index" in options:
        index = options["task_index"]
        if isinstance(index, np.integer):
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(rows):
            raise ValueError(f"options['task_index'] must be an int in [0, {len(rows)}), got {index!r}")
        return index, rows[index]
    index = int(rng.integers(len(rows)))
    return index, rows[index]
