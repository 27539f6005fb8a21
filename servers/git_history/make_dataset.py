"""Write ``git_history`` rows from a seed: a history per row, a question about it, the exact answer.

Example:
    >>> rows = make_dataset(4, seed=0)
    >>> [r["kind"] for r in rows]
    ['author', 'file', 'count', 'first']
    >>> make_dataset(4, seed=0) == rows
    True

From a shell::

    python -m nemo_gym_env.servers.git_history.make_dataset --size 200 --seed 0 --out train.jsonl

Rows take turns between the :data:`KINDS`; each row's history has its own seed (drawn from
``seed``) and 3 to 8 commits. The answer is computed from the history itself
(:func:`~nemo_gym_env.servers.git_history.history.make_history`), the same one the server
writes as a repository, so a row and its repository never disagree.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_gym_env.servers.git_history.history import MAX_COMMITS, MIN_COMMITS, Commit, make_history

__all__ = ["KINDS", "SYSTEM_PROMPT", "TOOLS", "main", "make_dataset", "make_row", "question"]

KINDS = ("author", "file", "count", "first")

SYSTEM_PROMPT = (
    "You answer questions about a Git repository with the git tools. Pass repo_path \".\" to every tool: "
    "it is the repository of this task. git_log lists the commits (newest first) with their hash, author and "
    "message; git_show shows one commit (by hash) and the file it changed. End your reply with the final "
    "answer as \\boxed{answer}."
)
"""The system message of every row."""

TOOLS = [
    {"type": "function", "name": "git_log",
     "description": "Show the commit log of the repository: each commit's hash, author, date and message, newest first.",
     "parameters": {"type": "object", "properties": {
         "repo_path": {"type": "string", "description": "The repository: always \".\"."},
         "max_count": {"type": "integer", "description": "How many commits at most (default 10)."}},
         "required": ["repo_path"]}, "strict": False},
    {"type": "function", "name": "git_show",
     "description": "Show one commit: its author, date, message and the diff of the file it changed.",
     "parameters": {"type": "object", "properties": {
         "repo_path": {"type": "string", "description": "The repository: always \".\"."},
         "revision": {"type": "string", "description": "A commit hash (or HEAD, HEAD~1, ...)."}},
         "required": ["repo_path", "revision"]}, "strict": False},
]
"""The tools a row shows the model (a subset of what ``mcp-server-git`` takes)."""


def question(kind: str, commits: list[Commit], target: int) -> tuple[str, str]:
    """The question of ``kind`` about commit ``target`` of ``commits``, and its exact answer."""
    chosen = commits[target]
    if kind == "author":
        return f"Who is the author of the commit with the message \"{chosen.message}\"?", chosen.author
    if kind == "file":
        return f"Which file did the commit with the message \"{chosen.message}\" change?", chosen.path
    if kind == "count":
        return "How many commits does the main branch have?", str(len(commits))
    if kind == "first":
        return "What is the message of the first (oldest) commit?", commits[0].message
    raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")


def make_row(history_seed: int, num_commits: int, kind: str, target: int = 0) -> dict[str, Any]:
    """One row: the question of ``kind`` about history ``history_seed`` (commit ``target`` where it names one)."""
    commits = make_history(history_seed, num_commits)
    text, answer = question(kind, commits, target % num_commits)
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}],
            "tools": TOOLS,
        },
        "history_seed": history_seed,
        "num_commits": num_commits,
        "kind": kind,
        "expected_answer": answer,
    }


def make_dataset(size: int, seed: int = 0, kinds: Sequence[str] = KINDS) -> list[dict[str, Any]]:
    """``size`` rows, the same for the same ``seed``, taking turns between ``kinds``."""
    rng = random.Random(seed)
    rows = []
    for index in range(size):
        count = rng.randint(MIN_COMMITS, MAX_COMMITS)
        rows.append(make_row(rng.randrange(2**31), count, kinds[index % len(kinds)], rng.randrange(count)))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nemo_gym_env.servers.git_history.make_dataset``: write rows as JSONL."""
    parser = argparse.ArgumentParser(description="Write git_history task rows (JSONL).")
    parser.add_argument("--size", type=int, default=100, help="number of rows (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the histories and questions (default 0)")
    parser.add_argument("--out", default="-", help="output file (default: standard output)")
    args = parser.parse_args(argv)
    text = "".join(json.dumps(row) + "\n" for row in make_dataset(args.size, seed=args.seed))
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
