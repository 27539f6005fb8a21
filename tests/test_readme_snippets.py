"""The README's Python snippets that run on their own, run as a user copies them: each in a fresh
``python`` in an empty folder, nothing defined for it. What a snippet prints after ``# `` on a
``print`` line (and on the comment lines right below it, joined by spaces) is what it must print.

A snippet is named by its section heading and its place among the section's ```python blocks.
Snippets that print what depends on the run (a port) or write files are checked by what they did;
a server class is written to ``app.py`` and played in process, as ``nemo_gym_env.server.testing``
plays one. Every README block parses and defines what it uses (``tests/test_doc_snippets.py``); the
ones not run here train a model (TRL) or need the MCP example's folder (``tests/server/test_mcp_docs.py``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from .cli.conftest import cli_env

README = Path(__file__).resolve().parent.parent / "README.md"
# The snippets under these headings are whole programs (the first one opens the README).
WHOLE = ("# nemo_gym_env", "## Vectorized rollouts")
REWARDS = "## Reward components and step rewards"


def whole_snippets() -> dict[str, str]:
    return {heading: snippet(heading) for heading in WHOLE}


def snippet(heading: str, index: int = 0) -> str:
    """The ``index``-th ```python block of the README section ``heading`` (up to the next heading of its level)."""
    level = heading.index(" ")
    blocks: list[str] = []
    inside, fence, body = False, None, []
    for line in README.read_text().splitlines():
        if fence is not None:
            if line.strip() == "```":
                if inside and fence == "python":
                    blocks.append("\n".join(body) + "\n")
                fence, body = None, []
            else:
                body.append(line)
        elif line.startswith("```"):
            fence = line[3:].strip()
        elif line == heading:
            inside = True
        elif inside and re.match(rf"#{{1,{level}}} ", line):
            break
    assert index < len(blocks), f"{heading!r} has {len(blocks)} python block(s), not {index + 1}"
    return blocks[index]


def promised(body: str) -> list[str]:
    """What each top-level ``print(...)  # TEXT`` line says it prints (TEXT goes on over ``#`` lines below it)."""
    found: list[str] = []
    continuing = False
    for line in body.splitlines():
        if line.startswith("print(") and "# " in line:
            found.append(line.split("# ", 1)[1].strip())
            continuing = True
        elif continuing and line[:1].isspace() and line.lstrip().startswith("#"):
            found[-1] += " " + line.lstrip()[1:].strip()
        else:
            continuing = False
    return found


def run(body: str, folder: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", body], cwd=folder, env=cli_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, body + done.stderr[-3000:]
    return done


def test_promised_reads_print_comments_and_their_continuations():
    body = 'x = 1\nprint(x)   # 1\nprint({"a": 1, "b": 2})   # {\'a\': 1,\n                          #  \'b\': 2}\nx  # 3\n'
    assert promised(body) == ["1", "{'a': 1, 'b': 2}"]


@pytest.mark.parametrize("heading", WHOLE)
def test_the_snippet_runs_as_written_and_prints_what_it_says(heading, tmp_path):
    body = whole_snippets()[heading]
    done = run(body, tmp_path)
    assert promised(body) and done.stdout.strip().splitlines() == promised(body), (done.stdout, promised(body))


@pytest.mark.slow  # each starts a bundled server (the Mixtures ones two)
@pytest.mark.parametrize(("heading", "index"), [
    ("## The Env", 0),            # NemoGym/Generic-v0 on a config and rows
    (REWARDS, 0),                 # reward components
    (REWARDS, 2),                 # step rewards
    ("## Mixtures", 0),           # the vector mixture
    ("## Mixtures", 1),           # the single-env mixture
])
def test_more_snippets_run_as_written_and_print_what_they_say(heading, index, tmp_path):
    body = snippet(heading, index)
    done = run(body, tmp_path)
    assert promised(body) and done.stdout.strip().splitlines() == promised(body), (done.stdout, promised(body))


def test_the_mixture_task_list_is_written_as_said(tmp_path):
    run(snippet("## Mixtures", 2), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "mix.jsonl").read_text().splitlines()]
    assert Counter(row["agent_ref"]["name"] for row in rows) == {"math": 6, "mcqa": 2}  # 8 rows, weights 0.75/0.25
    assert all(row["environment"] == f"NemoGym/{row['agent_ref']['name']}-v0" for row in rows)


@pytest.mark.parametrize(("heading", "index", "server", "call", "expected"), [
    ("## Writing a server", 0, "WeatherServer", ("/get_weather", {"city": "Winnipeg"}),
     "200 None {'city': 'Winnipeg', 'weather_description': 'The weather in Winnipeg is cold.'} 1.0"),
    (REWARDS, 1, "GlossaryServer", ("/lookup", {"word": "gym"}),
     "200 0.1 {'word': 'gym', 'definition': 'gym: see the glossary'} 1.0"),
], ids=["WeatherServer", "GlossaryServer"])
def test_the_server_snippet_serves_its_tool(heading, index, server, call, expected, tmp_path):
    """The class written to ``app.py``, imported as a user's test imports it: its tool answers (with its
    step-reward header, if any) and ``/verify`` scores."""
    (tmp_path / "app.py").write_text(snippet(heading, index))
    route, body = call
    driver = textwrap.dedent(f"""
        from app import {server}
        from nemo_gym_env.server.testing import app_client, assistant_message, verify

        row = {{"responses_create_params": {{"input": "hello"}}}}
        with app_client({server}, name="mine") as client:
            client.post("/seed_session", json=row).raise_for_status()
            reply = client.post({route!r}, json={body!r})
            print(reply.status_code, reply.headers.get("x-nemo-gym-step-reward"), reply.json(),
                  verify(client, row, [assistant_message("done")])["reward"])
    """)
    assert run(driver, tmp_path).stdout.strip() == expected


@pytest.mark.slow  # starts a bundled server
def test_the_launcher_snippet_prints_each_server_and_its_url(tmp_path):
    done = run(snippet("## Launching servers"), tmp_path)
    assert re.fullmatch(r"example_multi_step http://127\.0\.0\.1:\d+", done.stdout.strip()), done.stdout
