"""Server logs on this process's stderr: the launcher's ``stream_logs=True``."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["LogStreamer"]


class LogStreamer:
    """Echo new lines of log files to stderr as ``[name] line`` (tails the files, never blocks a child)."""

    def __init__(self) -> None:
        self._files: dict[Path, list[Any]] = {}  # path -> [name, offset, partial bytes]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemo-gym-env-logs", daemon=True)
        self._thread.start()

    def add(self, name: str, path: Path) -> None:
        """Follow ``path`` from its start, its lines prefixed ``[name]``."""
        with self._lock:
            self._files[path] = [name, 0, b""]

    def close(self) -> None:
        """Echo what is left and stop following."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._pump(final=False)
        self._pump(final=True)

    def _pump(self, final: bool) -> None:
        with self._lock:
            entries = list(self._files.items())
        for path, entry in entries:
            name, offset, partial = entry
            try:
                with open(path, "rb") as f:
                    if os.fstat(f.fileno()).st_size < offset:
                        offset = 0  # truncated: a fresh start under the same name
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            entry[1] = offset + len(data)
            *lines, rest = (partial + data).split(b"\n")
            if final and rest:
                lines, rest = [*lines, rest], b""
            entry[2] = rest
            if lines:
                text = "".join(f"[{name}] {line.decode('utf-8', errors='replace')}\n" for line in lines)
                try:
                    sys.stderr.write(text)
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
