"""The examples of docs/mcp.md, run as a user runs them: every block whose first line is
``# file: PATH`` is written to a folder, then the scripts run against real servers."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
pytest.importorskip("mcp_server_time")

from tests.server.mcp_serving import start_serve, stop_serve  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "mcp.md"
_BLOCK = re.compile(r"```(?:python|yaml)\n# file: (\S+)\n(.*?)```", re.DOTALL)


def doc_files() -> dict[str, str]:
    """``path -> text`` of the doc's file blocks (the ``# file:`` line dropped)."""
    return {path: text for path, text in _BLOCK.findall(DOC.read_text())}


def write_doc_files(folder: Path) -> None:
    for path, text in doc_files().items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def run(folder: Path, *args: str) -> str:
    """Run a doc's script; it must succeed and print nothing on stderr (no warning of the MCP SDK's either)."""
    done = subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
    return done.stdout


def test_the_doc_has_its_examples():
    assert {"play_over_mcp.py", "clock/configs/clock.yaml", "clock/app.py", "clock/verify.py", "play_clock.py",
            "notes/app.py"} <= set(doc_files())


def test_an_mcp_client_plays_a_served_environment(tmp_path):
    write_doc_files(tmp_path)
    proc, urls = start_serve("example_single_tool_call", "--mcp")
    try:
        out = run(tmp_path, "play_over_mcp.py", urls["example_single_tool_call"])
    finally:
        stop_serve(proc)
    lines = out.splitlines()
    assert "Winnipeg" in lines[0] and lines[1] == "['get_weather', 'verify']"
    assert "cold" in lines[2] and lines[-2:] == ["reward 1.0", "reward 0.0"]


def test_an_mcp_server_from_pypi_as_an_environment(tmp_path):
    write_doc_files(tmp_path)
    out = run(tmp_path, "play_clock.py")
    assert '"target"' in out and out.splitlines()[-1] == "reward 1.0"


def test_the_class_example_prepares_each_session_and_scores(tmp_path):
    write_doc_files(tmp_path)
    spec = importlib.util.spec_from_file_location("doc_notes_app", tmp_path / "notes" / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = module.NotesServer.from_config({"mcp_server": {"command": "unused"}})
    server.prepare_session({"notes": "buy milk"}, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "buy milk"
    answer = [{"type": "message", "role": "assistant", "content": "milk"}]
    assert asyncio.run(server.score({"expected_answer": "milk"}, answer, "s"))["reward"] == 1.0
