"""reasoning-gym tasks by reference: ``(name, seed, size, config, index)`` -> entry -> score.

A row never carries its answer: the verifier rebuilds the entry from the row's task fields
with the ``reasoning-gym`` library and scores with the library's own ``score_answer``.

Example:
    >>> key = TaskKey("basic_arithmetic", seed=0, size=5, config="{}", index=2)
    >>> entry = regenerate(key)                         # in a worker with a fixed hash seed
    >>> entry["answer"]
    '3'
    >>> run_deterministic(score, [(key, "3", entry["question"])])
    [{'score': 1.0}]

The functions :func:`generate_questions`, :func:`entry` and :func:`score` run inside
:class:`~nemo_gym_env.servers.reasoning_gym.pool.WorkerPool` workers (fixed hash seed,
killable on timeout); each worker keeps the datasets and entries it built in LRU caches.
:func:`run_deterministic` and :func:`regenerate` run them from any process.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_env.servers.reasoning_gym.pool import WorkerPool

__all__ = [
    "RESERVED_CONFIG_KEYS",
    "WORKER_PRELOAD",
    "TaskKey",
    "canonical_config",
    "entry",
    "generate_questions",
    "library_version",
    "regenerate",
    "run_deterministic",
    "score",
    "task_names",
]

RESERVED_CONFIG_KEYS = frozenset({"seed", "size"})
"""Dataset config keys that rows hold in their own fields (``task_seed``, ``task_size``)."""

WORKER_PRELOAD = ("nemo_gym_env.servers.reasoning_gym.tasks", "reasoning_gym")
"""What a worker imports before its first call."""

_DATASET_CACHE = 256
_ENTRY_CACHE = 4096


def canonical_config(config: Mapping[str, Any] | None) -> str:
    """A task config as canonical JSON (sorted keys, no spaces): the cache and identity key.

    Example:
        >>> canonical_config({"min_terms": 2, "max_terms": 3})
        '{"max_terms":3,"min_terms":2}'

    Raises:
        ValueError: If the config holds ``seed`` or ``size`` or is not JSON.
    """
    config = dict(config or {})
    reserved = sorted(RESERVED_CONFIG_KEYS & config.keys())
    if reserved:
        raise ValueError(
            f"task config must not set {reserved}: the seed and size are the row's task_seed and task_size"
        )
    try:
        return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"task config must be JSON (rows store it as JSON): {exc}") from None


@dataclass(frozen=True)
class TaskKey:
    """Which reasoning-gym entry a row is: dataset ``name`` built with ``seed``, ``size`` and ``config``, item ``index``."""

    name: str
    seed: int
    size: int
    config: str
    index: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TaskKey:
        """The key of a dataset row (``task_name``, ``task_seed``, ``task_size``, ``task_config``, ``task_index``)."""
        return cls(
            name=row["task_name"],
            seed=int(row["task_seed"]),
            size=int(row["task_size"]),
            config=canonical_config(row.get("task_config")),
            index=int(row["task_index"]),
        )


def library_version() -> str:
    """The installed reasoning-gym version (named in mismatch messages)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:
        return "unknown"


def task_names() -> list[str]:
    """Every dataset name the installed reasoning-gym registers, sorted."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


# ---- worker side --------------------------------------------------------------------------


@functools.lru_cache(maxsize=_DATASET_CACHE)
def _dataset(name: str, seed: int, size: int, config: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config))


@functools.lru_cache(maxsize=_ENTRY_CACHE)
def _entry(key: TaskKey) -> dict[str, Any]:
    return _dataset(key.name, key.seed, key.size, key.config)[key.index]


def generate_questions(name: str, seed: int, size: int, config: str) -> list[str]:
    """The questions of items ``0 .. size-1`` of a dataset (worker side; used by the generator)."""
    if name not in task_names():
        raise ValueError(f"reasoning-gym {library_version()} has no task named {name!r}")
    dataset = _dataset(name, seed, size, config)
    return [dataset[index]["question"] for index in range(size)]


def entry(key: TaskKey) -> dict[str, Any]:
    """The full entry (``question``, ``answer``, ``metadata``) of ``key`` (worker side)."""
    return copy.deepcopy(_entry(key))


def score(key: TaskKey, answer: str | None, question: str | None) -> dict[str, Any]:
    """Score ``answer`` against the regenerated entry of ``key`` (worker side).

    Returns ``{"score": float}`` (the library's raw score), or ``{"failure_kind": ...,
    "failure_reason": ...}`` when the task cannot be rebuilt or scored: ``unknown_task``,
    ``invalid_task_config``, ``task_mismatch`` (the regenerated question differs from
    ``question``, the one the row showed the model) or ``scorer_error``.
    """
    from reasoning_gym.factory import DATASETS

    if key.name not in DATASETS:
        return _failure(
            "unknown_task",
            f"reasoning-gym {library_version()} has no task named {key.name!r}; "
            "`python -m nemo_gym_env.servers.reasoning_gym.make_dataset --list` lists the task names",
        )
    try:
        dataset = _dataset(key.name, key.seed, key.size, key.config)
    except Exception as exc:
        return _failure(
            "invalid_task_config",
            f"reasoning-gym cannot build {key.name!r} with task_config {key.config}: {type(exc).__name__}: {exc}",
        )
    try:
        item = entry(key)
    except Exception as exc:
        return _failure(
            "invalid_task_config", f"reasoning-gym cannot generate {key}: {type(exc).__name__}: {exc}"
        )
    if question is not None and item["question"] != question:
        return _failure(
            "task_mismatch",
            f"the row's question differs from the one reasoning-gym {library_version()} generates for "
            f"{key.name!r} (seed {key.seed}, size {key.size}, index {key.index}, config {key.config}); "
            "the row was edited or made with another reasoning-gym version: regenerate the dataset",
        )
    try:
        value = float(dataset.score_answer(answer, item))
    except Exception as exc:
        return _failure("scorer_error", f"{key.name} score_answer raised {type(exc).__name__}: {exc}")
    if not math.isfinite(value):
        return _failure("scorer_error", f"{key.name} score_answer returned {value!r}")
    return {"score": value}


def score_entry(name: str, answer: str | None, item: dict[str, Any]) -> dict[str, Any]:
    """Score ``answer`` against an entry the row carries (NeMo Gym's rows: ``question``, ``answer``,
    ``metadata``), with the library's scorer for ``name`` (worker side).

    Returns ``{"score": float}``, or ``{"failure_kind", "failure_reason"}``: ``unknown_task``
    (no such task in this library version) or ``scorer_error``.
    """
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        return _failure("unknown_task", f"reasoning-gym {library_version()} has no task named {name!r}")
    try:
        value = float(reasoning_gym.get_score_answer_fn(name)(answer=answer, entry=item))
    except Exception as exc:
        return _failure("scorer_error", f"{name} score_answer raised {type(exc).__name__}: {exc}")
    if not math.isfinite(value):
        return _failure("scorer_error", f"{name} score_answer returned {value!r}")
    return {"score": value}


def _failure(kind: str, reason: str) -> dict[str, str]:
    return {"failure_kind": kind, "failure_reason": reason}


# ---- caller side ----------------------------------------------------------------------------

_shared_lock = threading.Lock()
_shared_pool: WorkerPool | None = None


def _hash_seed_is_fixed() -> bool:
    """Whether this interpreter already hashes like the workers (``PYTHONHASHSEED=0``)."""
    return sys.flags.hash_randomization == 0


def shared_pool() -> WorkerPool:
    """This process's pool for :func:`run_deterministic` (started on first use, stopped at exit)."""
    global _shared_pool
    with _shared_lock:
        if _shared_pool is None or _shared_pool.closed:
            workers = max(1, min(4, os.cpu_count() or 1))
            _shared_pool = WorkerPool(workers, preload=WORKER_PRELOAD)
        return _shared_pool


def run_deterministic(
    fn: Callable[..., Any], arg_tuples: Sequence[tuple], timeout: float | None = None
) -> list[Any]:
    """``[fn(*args) for args in arg_tuples]`` under hash seed 0: here if this process has it, else in workers.

    Raises:
        pool.WorkerError: ``fn`` raised (the message names the exception).
    """
    if _hash_seed_is_fixed():
        return [fn(*args) for args in arg_tuples]
    return shared_pool().map(fn, arg_tuples, timeout=timeout)


def regenerate(key: TaskKey) -> dict[str, Any]:
    """The entry of ``key``, exactly as the server rebuilds it (for scripted players and tests)."""
    return run_deterministic(entry, [(key,)])[0]
