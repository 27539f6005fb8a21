"""The README's Python snippets that run on their own, run as a user copies them: each in a fresh
``python`` in an empty folder, nothing defined for it. What a snippet prints after ``# `` on a
``print`` line is what it must print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .cli.conftest import cli_env

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"```python\n(?P<body>.*?)```", re.DOTALL)
# The snippets under these headings are whole programs (the first one opens the README).
WHOLE = ("# nemo_gym_env", "## Vectorized rollouts")


def whole_snippets() -> dict[str, str]:
    text = README.read_text()
    found = {}
    for heading in WHOLE:
        start = text.index(heading + "\n")
        found[heading] = BLOCK.search(text, start)["body"]
    return found


@pytest.mark.parametrize("heading", WHOLE)
def test_the_snippet_runs_as_written_and_prints_what_it_says(heading, tmp_path):
    body = whole_snippets()[heading]
    done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    promised = [line.split("# ", 1)[1].strip() for line in body.splitlines() if line.startswith("print(")]
    assert promised and done.stdout.strip().splitlines() == promised, (done.stdout, promised)
