"""Helpers for the viewer tests: run ``nemo-gym-env view`` / ``play`` as real processes on loopback."""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import CLI, cli_env
from tests.viewer.rollout_data import failure_row, played_rows, write_rows

URL_LINE = re.compile(r"^nemo-gym-env (?:view|play): (http://\S+?)/?$")


@dataclass
class Running:
    """A running ``nemo-gym-env view`` or ``play``: its process, URL and output so far."""

    proc: subprocess.Popen
    url: str
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, trust_env=False, timeout=60.0, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        with self.client() as client:
            return client.get(path, **kwargs)

    def post(self, path: str, body: object = None, **kwargs) -> httpx.Response:
        with self.client() as client:
            return client.post(path, json={} if body is None else body, **kwargs)

    def raw(self, request: bytes) -> bytes:
        """Send bytes as they are (no client normalises the path) and return the whole reply (what came
        before the server closed, if it did so early)."""
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        chunks = []
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            try:
                conn.sendall(request)
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
            except ConnectionResetError:  # a server refusing a request may close before reading all of it
                pass
        return b"".join(chunks)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def _pump(stream, sink) -> None:
    for line in iter(stream.readline, ""):
        sink(line)
    stream.close()


@contextlib.contextmanager
def running_cli(*args: str, cwd: Path, timeout: float = 120.0) -> Iterator[Running]:
    """``nemo-gym-env ARGS`` in ``cwd``, once it has printed its URL; stopped (SIGTERM) afterwards."""
    proc = subprocess.Popen([*CLI, *args], cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: queue.Queue = queue.Queue()
    running = Running(proc, "")
    def keep(line: str) -> None:
        running.stdout.append(line)
        lines.put(line)

    threads = [threading.Thread(target=_pump, args=(proc.stdout, keep), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, running.stderr.append), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not running.url:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{args} did not print its URL (exit {proc.poll()}):\n"
                                         f"{''.join(running.stdout)}{''.join(running.stderr)}") from None
                continue
            match = URL_LINE.match(line.strip())
            if match:
                running.url = match.group(1)
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        for thread in threads:
            thread.join(5)


def wait_until(condition, *, timeout: float = 60.0, interval: float = 0.05, what: str = "the condition"):
    """Poll ``condition()`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def proc_status(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` figure in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def proc_read_bytes(pid: int) -> int:
    """Bytes the process has read through read() and friends (``rchar`` of ``/proc/<pid>/io``)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise KeyError("rchar")


@pytest.fixture(scope="session")
def played_file(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A rollouts file (and sidecar) of real episodes: two bundled servers, rewards 1 and 0 in turn,
    two standing failures and one retried. Copy it before changing it."""
    rows = played_rows("example_multi_step", tasks=2, repeats=4)
    rows += [{**row, "_ng_task_index": row["_ng_task_index"] + 10}
             for row in played_rows("example_single_tool_call", tasks=2, repeats=2)]
    failures = [
        failure_row(20, 0, "example_multi_step", "policy 'openai' (task 20, rollout 0, turn 1): no answer within 60 s"),
        failure_row(21, 0, "example_multi_step", "policy 'openai' (task 21, rollout 0, turn 3): no answer within 60 s"),
        failure_row(0, 0, "example_multi_step", "retried later: has an output row"),
    ]
    return write_rows(tmp_path_factory.mktemp("played") / "rollouts.jsonl", rows, failures), rows
