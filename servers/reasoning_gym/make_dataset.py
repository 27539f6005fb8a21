"""Write reasoning-gym task rows of any size from a seed.

Example:
    >>> rows = make_dataset(["basic_arithmetic", "leg_counting"], size=4, seed=0)
    >>> [(r["task_name"], r["task_index"]) for r in rows]
    [('basic_arithmetic', 0), ('leg_counting', 0), ('basic_arithmetic', 1), ('leg_counting', 1)]

From a shell::

    python -m nemo_gym_env.servers.reasoning_gym.make_dataset \\
        --tasks basic_arithmetic,leg_counting --size 1000 --seed 0 --out tasks.jsonl
    python -m nemo_gym_env.servers.reasoning_gym.make_dataset --list

Rows hold the question, never the answer: ``task_name``, ``task_seed``, ``task_size``,
``task_index`` and ``task_config`` name the reasoning-gym entry, which the server rebuilds
to score. Tasks take turns (row ``i`` is task ``i % len(task_names)``, item ``i //
len(task_names)`` of that task's dataset), and every task's dataset is built with ``seed``
and a ``size`` equal to the number of rows it gets (some generators, ``acre`` among them,
write different items for different sizes, so the size is part of a row's identity).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_gym_env.servers.reasoning_gym import tasks
from nemo_gym_env.servers.reasoning_gym.pool import WorkerError

__all__ = ["DEFAULT_SYSTEM_PROMPT", "main", "make_dataset", "make_row"]

DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem. You may think step by step first. Then give only your final answer, "
    "with nothing else, between <answer> and </answer> tags, for example <answer>42</answer>. "
    "If the question shows an answer format, follow it exactly inside the tags."
)
"""System message of every row: where the verifier looks for the answer (``<answer>`` tags)."""


def make_row(
    name: str,
    seed: int,
    size: int,
    index: int,
    question: str,
    config: str = "{}",
    *,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
) -> dict[str, Any]:
    """One dataset row for item ``index`` of reasoning-gym dataset ``name`` (config as canonical JSON)."""
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
        },
        "question": question,
        "task_name": name,
        "task_seed": seed,
        "task_size": size,
        "task_index": index,
        "task_config": json.loads(config),
    }


def make_dataset(
    task_names: Sequence[str],
    size: int,
    seed: int,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
) -> list[dict[str, Any]]:
    """``size`` rows cycling through ``task_names``; the same arguments always give the same rows.

    Args:
        task_names: reasoning-gym dataset names (``--list`` shows them), each at most once.
        size: Number of rows in all.
        seed: Seed of every task's dataset (the row's ``task_seed``).
        config: Per-task dataset settings, keyed by task name:
            ``{"basic_arithmetic": {"min_terms": 2, "max_terms": 3}}``. ``seed`` and ``size``
            are not settings (they come from the arguments).
        system_prompt: The system message of every row.

    Raises:
        ValueError: Unknown task, repeated task, bad config, or a dataset reasoning-gym cannot build.
        TypeError: A task's config is not a mapping.
    """
    names = list(task_names)
    if not names:
        raise ValueError("give at least one task name")
    if len(set(names)) != len(names):
        raise ValueError(f"task names repeat: {names}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    config = dict(config or {})
    stray = sorted(set(config) - set(names))
    if stray:
        raise ValueError(
            f"config keys must be task names from {names}, got {stray}; "
            f"write per-task settings as {{'{names[0]}': {{'setting': value}}}}"
        )
    configs = {}
    for name in names:
        if not isinstance(config.get(name, {}), Mapping):
            raise TypeError(f"config[{name!r}] must be a mapping of dataset settings")
        configs[name] = tasks.canonical_config(config.get(name))
    known = set(tasks.run_deterministic(tasks.task_names, [()])[0])  # asked of a worker: no import here
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"reasoning-gym {tasks.library_version()} has no task named {unknown}; "
            "`python -m nemo_gym_env.servers.reasoning_gym.make_dataset --list` lists them"
        )
    counts = [size // len(names) + (1 if k < size % len(names) else 0) for k in range(len(names))]
    jobs = [(name, seed, count, configs[name]) for name, count in zip(names, counts) if count]
    try:
        questions = dict(
            zip((job[0] for job in jobs), tasks.run_deterministic(tasks.generate_questions, jobs))
        )
    except WorkerError as exc:
        raise ValueError(f"reasoning-gym could not generate the tasks: {exc}") from None
    rows = []
    for i in range(size):
        k, index = i % len(names), i // len(names)
        name = names[k]
        rows.append(
            make_row(
                name,
                seed,
                counts[k],
                index,
                questions[name][index],
                configs[name],
                system_prompt=system_prompt,
            )
        )
    return rows


def write_jsonl(rows: Sequence[Mapping[str, Any]], out: Path | None) -> None:
    """Rows as JSON lines to ``out`` (stdout when None)."""
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if out is None:
        sys.stdout.write(lines)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(lines, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m nemo_gym_env.servers.reasoning_gym.make_dataset",
        description="Write reasoning-gym task rows (JSONL) for the reasoning_gym resources server.",
    )
    parser.add_argument(
        "--tasks", help="comma-separated reasoning-gym task names, e.g. basic_arithmetic,leg_counting"
    )
    parser.add_argument("--size", type=int, default=100, help="number of rows in all (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="dataset seed (default 0)")
    parser.add_argument(
        "--config", default=None, help='per-task settings as JSON: \'{"basic_arithmetic": {"max_terms": 3}}\''
    )
    parser.add_argument("--system-prompt", default=DEFAULT_SYSTEM_PROMPT, help="system message of every row")
    parser.add_argument("--out", type=Path, default=None, help="output JSONL path (default: stdout)")
    parser.add_argument("--list", action="store_true", help="print the available task names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(tasks.task_names()))
        return 0
    if not args.tasks:
        parser.error("--tasks is required (or --list)")
    try:
        config = json.loads(args.config) if args.config else None
    except json.JSONDecodeError as exc:
        parser.error(f"--config is not JSON: {exc}")
    if config is not None and not isinstance(config, dict):
        parser.error("--config must be a JSON object keyed by task name")
    started = time.perf_counter()
    try:
        rows = make_dataset(
            [t.strip() for t in args.tasks.split(",") if t.strip()],
            args.size,
            args.seed,
            config,
            system_prompt=args.system_prompt,
        )
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    write_jsonl(rows, args.out)
    print(
        f"wrote {len(rows)} rows to {args.out or 'stdout'} in {time.perf_counter() - started:.2f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
