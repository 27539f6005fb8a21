"""Helpers for the CLI tests: run ``nemo-gym-env`` as a real process, watch its descendants.

``descendants`` and ``wait_gone`` are the suite's (:mod:`tests.conftest`), imported here for
the tests that take them from this module.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..conftest import as_a_background_job, descendants, wait_gone

__all__ = ["CANARY", "CLI", "REPO", "Served", "assert_one_line_error", "cli_env", "descendants", "mixed_rows", "mixed_run",
           "read_jsonl", "run_cli", "run_mixed", "wait_gone"]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "nemo_gym_env.cli"]
CANARY = "CANARY-7f3a9c0e51d2"


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI child: no proxies, this checkout importable, unbuffered."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_cli(*args: str, cwd: Path | str | None = None, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess:
    """Run ``python -m nemo_gym_env.cli ARGS`` to completion."""
    return subprocess.run(
        [*CLI, *args], cwd=cwd, env=cli_env(**extra_env), capture_output=True, text=True, timeout=timeout, check=False
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def assert_one_line_error(result: subprocess.CompletedProcess) -> None:
    """Non-zero exit, no traceback, and the error on one stderr line."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr


@dataclass
class Served:
    """A running ``nemo-gym-env serve``: its process, printed URLs and collected output."""

    proc: subprocess.Popen
    urls: dict[str, str]
    stdout_lines: list[str]
    _stdout: queue.Queue = field(repr=False)
    _stderr_lines: list[str] = field(repr=False, default_factory=list)
    _threads: list[threading.Thread] = field(repr=False, default_factory=list)

    @property
    def head(self) -> str:
        return self.urls["head_server"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> tuple[int, str, str]:
        """Send ``sig``; return (exit code, all stdout, all stderr). Its stopping is bounded (5 s for the head
        server, 5 s per server before SIGKILL)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # say where it hangs: faulthandler prints every thread on SIGABRT
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(10)
            for thread in self._threads:
                thread.join(5)
            raise AssertionError(f"serve still ran {timeout:g} s after signal {sig}; its threads and output:\n"
                                 + "".join(self._stderr_lines)[-8000:]) from None
        for thread in self._threads:
            thread.join(5)
        while not self._stdout.empty():
            self.stdout_lines.append(self._stdout.get())
        return code, "".join(self.stdout_lines), "".join(self._stderr_lines)


def _pump(stream, sink) -> None:
    for line in iter(stream.readline, ""):
        sink(line)
    stream.close()


@pytest.fixture
def serve() -> Iterator:
    """``serve(*args)`` starts ``nemo-gym-env serve ARGS`` and waits for its URL lines."""
    started: list[Served] = []

    def start(*args: str, cwd: Path | None = None, timeout: float = 120.0, sigint_ignored: bool = False) -> Served:
        """``sigint_ignored``: started as a shell starts a background job (SIGINT ignored, inherited)."""
        command = [*CLI, "serve", *args]
        proc = subprocess.Popen(as_a_background_job(command) if sigint_ignored else command, cwd=cwd,
                                env=cli_env(PYTHONFAULTHANDLER="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        out: queue.Queue = queue.Queue()
        served = Served(proc, {}, [], out)
        threads = [
            threading.Thread(target=_pump, args=(proc.stdout, out.put), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, served._stderr_lines.append), daemon=True),
        ]
        for thread in threads:
            thread.start()
        served._threads = threads
        started.append(served)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = out.get(timeout=0.2)
            except queue.Empty:
                if proc.poll() is not None:
                    break
                continue
            served.stdout_lines.append(line)
            match = re.match(r"^\s+(\S+)\s+(http://\S+)", line)
            if match:
                served.urls[match.group(1)] = match.group(2)
            if line.startswith("Ctrl-C to stop"):
                return served
        code = served.stop(signal.SIGKILL)[0] if proc.poll() is None else proc.wait()
        raise AssertionError(f"serve did not start (exit {code}):\n{''.join(served.stdout_lines)}\n{''.join(served._stderr_lines)}")

    yield start
    for served in started:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait(10)


# ---- a run whose rows say different things -------------------------------------------------------

REWARDS_CONFIG = REPO / "tests" / "fixtures" / "servers" / "rewards" / "configs" / "rewards.yaml"


def mixed_rows() -> list[dict]:
    """Task rows on three servers whose rollouts, played by the test model ``acts-...``, end every way a row can.

    ``example_single_tool_call``: the model calls the tool (right), answers in prose (no tool call),
    writes a ``<tool_call>`` that is not JSON, calls a tool named ``nosuch`` (both bad tool calls);
    the ``rewards`` fixture: reward 1.0, two rows a verifier calls ``wrong_answer`` (a reply with
    ``mask_sample: true`` judged nothing: a failure, not a row; tests/protocol/test_failures.py);
    ``guess_number``: the model never guesses (a negative return, a game lost).
    """
    from nemo_gym_env.launch.catalog import bundled_dataset

    weather = [json.loads(line) for line in bundled_dataset("example_single_tool_call").read_text().splitlines()][:4]
    for row, act in zip(weather, ["", " [prose]", " [badcall]", " [nosuch]"]):
        row["responses_create_params"]["input"][-1]["content"] += act
        row["agent_ref"] = {"type": "resources_servers", "name": "example_single_tool_call"}
    scored = [{"responses_create_params": {"input": [{"role": "user", "content": f"Say {word}."}]},
               "agent_ref": {"type": "resources_servers", "name": "rewards"}, **fields}
              for word, fields in [("one", {"reward": 1.0}),
                                   ("two", {"reward": 0.0, "failure_kind": "wrong_answer"}),
                                   ("three", {"reward": 0.0, "failure_kind": "wrong_answer"})]]
    games = [json.loads(line) for line in bundled_dataset("guess_number").read_text().splitlines()][:2]
    for row in games:
        row["agent_ref"] = {"type": "resources_servers", "name": "guess_number"}
    return weather + scored + games


def mixed_run(folder: Path) -> subprocess.CompletedProcess:
    """:func:`run_mixed` against its own test model process, which must succeed."""
    from tests.fixtures.openai_server import running_server

    with running_server() as base_url:
        result = run_mixed(folder, base_url)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_mixed(folder: Path, base_url: str, *more: str) -> subprocess.CompletedProcess:
    """``nemo-gym-env rollouts`` of :func:`mixed_rows` (2 repeats each) with the test model, into ``folder/results``."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks = folder / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in mixed_rows()))
    return run_cli("rollouts", "example_single_tool_call", "guess_number", f"+config_paths=[{REWARDS_CONFIG}]",
                   "--input", str(tasks), "--policy", "openai", "--base-url", base_url, "--model", "acts-mixed",
                   "--num-repeats", "2", "--no-env-yaml", *more, cwd=folder, timeout=300)
