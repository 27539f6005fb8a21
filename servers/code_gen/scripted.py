"""Deterministic scripted player for ``code_gen`` (tests, quickstart, benchmarks).

Not a model. ``correct=True`` answers with a program that passes every test: a real solution
for the bundled example rows (matched by ``hash_id``), and for any other row a program that
looks its tests' answers up in a table (so it works on every dataset). ``correct=False``
answers with a program that runs cleanly but prints (or returns) a wrong answer.

Example:
    >>> row = {"verifier_metadata": {"unit_tests": {"inputs": ["2 3\\n"], "outputs": ["5\\n"]}}}
    >>> text = scripted_action(row, [])[0]["content"][0]["text"]
    >>> text.startswith("Here is my solution") and "```python" in text
    True
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["SOLUTIONS", "lookup_program", "scripted_action", "wrong_program"]

SOLUTIONS: dict[str, str] = {
    "ngenv-sum-of-list": (
        "import sys\n\n"
        "def main():\n"
        "    data = sys.stdin.read().split()\n"
        "    n = int(data[0])\n"
        "    print(sum(int(x) for x in data[1:1 + n]))\n\n"
        "main()\n"
    ),
    "ngenv-reverse-words": ("line = input()\nprint(' '.join(reversed(line.split())))\n"),
    "ngenv-gcd-pairs": (
        "from math import gcd\n\n"
        "t = int(input())\n"
        "for _ in range(t):\n"
        "    a, b = map(int, input().split())\n"
        "    print(gcd(a, b))\n"
    ),
    "ngenv-max-subarray": (
        "class Solution:\n"
        "    def maxSubArray(self, nums):\n"
        "        best = current = nums[0]\n"
        "        for x in nums[1:]:\n"
        "            current = max(x, current + x)\n"
        "            best = max(best, current)\n"
        "        return best\n"
    ),
    "ngenv-group-anagrams-count": (
        "def count_groups(words, min_size):\n"
        "    groups = {}\n"
        "    for word in words:\n"
        "        groups.setdefault(''.join(sorted(word)), []).append(word)\n"
        "    return sorted(len(g) for g in groups.values() if len(g) >= min_size)\n"
    ),
}
"""Reference solutions of the rows in ``data/example.jsonl``, keyed by ``hash_id``."""


def _tests(row: dict[str, Any]) -> dict[str, Any]:
    return row["verifier_metadata"]["unit_tests"]


def lookup_program(row: dict[str, Any]) -> str:
    """A program that passes ``row``'s tests by looking their answers up (works for any row)."""
    tests = _tests(row)
    if tests.get("fn_name"):
        table = {
            json.dumps([json.loads(line) for line in given.split("\n") if line.strip()]): expected
            for given, expected in zip(tests["inputs"], tests["outputs"])
        }
        return (
            "import json\n"
            f"ANSWERS = {table!r}\n\n"
            f"def {tests['fn_name']}(*args):\n"
            "    return json.loads(ANSWERS[json.dumps(list(args))])\n"
        )
    table = {given.strip(): expected for given, expected in zip(tests["inputs"], tests["outputs"])}
    return f"import sys\nANSWERS = {table!r}\nsys.stdout.write(ANSWERS.get(sys.stdin.read().strip(), ''))\n"


def wrong_program(row: dict[str, Any]) -> str:
    """A program that runs cleanly and fails every test (a wrong answer, not a crash)."""
    fn_name = _tests(row).get("fn_name")
    if fn_name:
        return f"def {fn_name}(*args):\n    return {{'__wrong__': True}}\n"
    return "import sys\nsys.stdin.read()\nprint('__wrong__')\n"


def scripted_action(
    row: dict[str, Any], history: list[dict[str, Any]], *, correct: bool = True
) -> list[dict]:
    """One assistant message with a program in a ```python block.

    Args:
        row: The dataset row being played (``hash_id`` and ``verifier_metadata.unit_tests`` are read).
        history: The items the environment has shown since reset (unused: one turn).
        correct: Pass every test (reward 1.0) or fail them (0.0).
    """
    if correct:
        program = SOLUTIONS.get(str(row.get("hash_id")), None) or lookup_program(row)
    else:
        program = wrong_program(row)
    text = f"Here is my solution.\n\n```python\n{program}```\n"
    return [assistant_message(text, "msg_0")]
