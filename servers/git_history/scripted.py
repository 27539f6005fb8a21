"""Deterministic scripted player for ``git_history`` (tests, the quickstart, benchmarks).

Not a model, but it does not peek at the answer either: it reads the question's ``kind`` and the
commit message in the question, calls ``git_log``, for a ``file`` question also ``git_show`` on
the commit it found, and answers from the tools' outputs (``correct=True``, reward 1.0) or
answers something else after the same calls (``correct=False``, reward 0.0).

Example:
    >>> row = {"kind": "count", "responses_create_params": {"input": [{"role": "user", "content": "How many?"}]}}
    >>> [call] = scripted_action(row, [])
    >>> call["name"], call["arguments"]
    ('git_log', '{"repo_path": ".", "max_count": 50}')
    >>> log = "Commit history:\\nCommit: 1f\\nAuthor: Ada Moreau\\nDate: d\\nMessage: Add the lexer\\n\\n"
    >>> scripted_action(row, [{"type": "function_call_output", "call_id": "call_t0_0", "output": log}])[0][
    ...     "content"][0]["text"]
    'There are \\\\boxed{1} commits.'
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym_env.protocol.dataset import input_items
from nemo_gym_env.protocol.items import content_text
from nemo_gym_env.protocol.scripting import CALL_ID, assistant_message, field, function_call, turn_of

__all__ = ["parse_log", "scripted_action"]

_ENTRY = re.compile(r"Commit: (\w+)\nAuthor: (.*)\nDate: .*\nMessage: (.*)")
_QUOTED = re.compile(r"\"(.+)\"")
_CHANGED = re.compile(r"^\+\+\+ b/(.+)$", re.MULTILINE)


def parse_log(text: str) -> list[dict[str, str]]:
    """The commits of a ``git_log`` output, newest first: ``{"hash", "author", "message"}``."""
    return [{"hash": h, "author": a.strip(), "message": m.strip()} for h, a, m in _ENTRY.findall(text)]


def _output_of(history: list[Any], turn: int) -> str:
    for item in history:
        match = CALL_ID.match(str(field(item, "call_id") or ""))
        if field(item, "type") == "function_call_output" and match and int(match.group(1)) == turn:
            return str(field(item, "output") or "")
    return ""


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True) -> list[dict[str, Any]]:
    """Next action (a list of Responses output item dicts) for the episode so far.

    Args:
        row: The row being played (``kind`` and the question in its input).
        history: The items the environment has shown since reset (the tool outputs).
        correct: Answer from the tools (reward 1.0) or something else after the same calls (0.0).
    """
    turn = turn_of(history)
    if turn == 0:
        return [function_call(0, 0, "git_log", {"repo_path": ".", "max_count": 50})]
    commits = parse_log(_output_of(history, 0))
    asked = _QUOTED.search(content_text(input_items(row)[-1].get("content")))
    target = next((c for c in commits if asked and c["message"] == asked.group(1)), None)
    kind = row.get("kind")
    if kind == "file" and turn == 1 and target is not None:
        return [function_call(1, 0, "git_show", {"repo_path": ".", "revision": target["hash"]})]
    if kind == "count":
        answer = str(len(commits) if correct else len(commits) + 1)
    elif kind == "first":
        answer = commits[-1]["message"] if commits and correct else "Initial commit"
    elif kind == "file":
        changed = _CHANGED.findall(_output_of(history, 1))
        answer = changed[-1] if changed and correct else "nothing.txt"
    else:
        answer = target["author"] if target is not None and correct else "Nobody"
    noun = "commits" if kind == "count" else "answer"
    return [assistant_message(f"There are \\boxed{{{answer}}} {noun}." if kind == "count"
                              else f"The {noun} is \\boxed{{{answer}}}.", f"msg_t{turn}")]
