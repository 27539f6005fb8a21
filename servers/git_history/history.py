"""The Git history of a ``git_history`` task, made from a seed, and written as a real repository.

A history is a few commits, each by one of :data:`AUTHORS`, changing one file, with a message
unique in its history; every date is fixed, so the same seed gives the same repository (the same
commit hashes) on every machine.

Example:
    >>> commits = make_history(3, 5)
    >>> len(commits), len({c.message for c in commits})
    (5, 5)
    >>> make_history(3, 5) == commits
    True
"""

from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AUTHORS", "FILES", "MAX_COMMITS", "MIN_COMMITS", "Commit", "make_history", "write_repo"]

AUTHORS = (("Ada Moreau", "ada@example.com"), ("Ben Okafor", "ben@example.com"), ("Chloe Silva", "chloe@example.com"),
           ("Dev Tanaka", "dev@example.com"), ("Elena Novak", "elena@example.com"))
FILES = ("README.md", "src/parser.py", "src/lexer.py", "src/cli.py", "docs/guide.md", "tests/test_parser.py",
         "setup.cfg", "CHANGELOG.md")
_VERBS = ("Add", "Fix", "Update", "Refactor", "Document", "Test", "Tidy", "Speed up")
_SUBJECTS = ("the parser", "the lexer", "the guide", "error messages", "the command line", "edge cases",
             "the changelog", "imports", "token positions", "the config reader")
MIN_COMMITS, MAX_COMMITS = 3, 8
_EPOCH = 1_700_000_000  # 2023-11-14: the first commit's date; each next one is a day later
_GIT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Commit:
    """One commit: who, what message, which file it changed and to what, when (Unix seconds)."""

    author: str
    email: str
    message: str
    path: str
    content: str
    timestamp: int


def make_history(seed: int, num_commits: int) -> list[Commit]:
    """The commits of history ``seed``, oldest first.

    Raises:
        ValueError: ``num_commits`` is outside [:data:`MIN_COMMITS`, :data:`MAX_COMMITS`].
    """
    if not MIN_COMMITS <= num_commits <= MAX_COMMITS:
        raise ValueError(f"num_commits must be in [{MIN_COMMITS}, {MAX_COMMITS}], got {num_commits}")
    rng = random.Random(seed)
    messages = rng.sample([f"{verb} {subject}" for verb in _VERBS for subject in _SUBJECTS], num_commits)
    commits = []
    for index, message in enumerate(messages):
        author, email = rng.choice(AUTHORS)
        path = rng.choice(FILES)
        content = f"# {path}\n{message} ({rng.randrange(10_000)})\n"
        commits.append(Commit(author, email, message, path, content, _EPOCH + 86_400 * index))
    return commits


def _fast_import_stream(commits: list[Commit]) -> bytes:
    """The commits as a ``git fast-import`` stream on ``refs/heads/main`` (files kept across commits)."""
    out = bytearray()
    for commit in commits:
        message, content = commit.message.encode(), commit.content.encode()
        who = f"{commit.author} <{commit.email}> {commit.timestamp} +0000".encode()
        out += b"commit refs/heads/main\nauthor " + who + b"\ncommitter " + who + b"\n"
        out += b"data %d\n%s\n" % (len(message), message)
        out += b"M 100644 inline %s\ndata %d\n%s\n" % (commit.path.encode(), len(content), content)
    return bytes(out)


def write_repo(path: Path, commits: list[Commit]) -> None:
    """Make ``path`` (an empty folder) a repository on branch ``main`` holding ``commits``, checked out.

    Three ``git`` processes, none of which reads the user's or the system's Git config.

    Raises:
        RuntimeError: a ``git`` command failed (its stderr is in the message).
    """
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GIT_")}, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull, "HOME": str(path), "LC_ALL": "C"}
    steps: list[tuple[list[str], bytes | None]] = [
        (["git", "init", "-q", "-b", "main"], None),
        (["git", "fast-import", "--quiet"], _fast_import_stream(commits)),
        (["git", "reset", "-q", "--hard", "main"], None),
    ]
    for command, stdin in steps:
        done = subprocess.run(command, cwd=path, input=stdin, env=env, capture_output=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed in {path}: {done.stderr.decode(errors='replace')[-500:]}")
