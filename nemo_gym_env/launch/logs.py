"""Server logs: the launcher's temporary log folders, and echoing logs on stderr (``stream_logs=True``)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["LOG_DIR_PREFIX", "LogStreamer", "temporary_log_dir"]

LOG_DIR_PREFIX = "nemo_gym_env_logs_"


def _process_tag(pid: int) -> str | None:
    """``<pid>-<start time>`` of a live process (None when it is gone): a pid alone can be reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return f"{pid}-{int(fields[19])}"  # field 22 of stat: the start time, in clock ticks since boot
    except FileNotFoundError:
        return None
    except (OSError, IndexError, ValueError):  # no /proc here: the pid is all there is
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return f"{pid}-0"


def temporary_log_dir() -> Path:
    """A new temporary log folder named after this process, after removing those of dead processes.

    A launcher removes its own folder when it closes; one killed with SIGKILL cannot, so the
    next launcher on the machine does: nothing accumulates in the temporary folder.
    """
    root = Path(tempfile.gettempdir())
    for folder in root.glob(f"{LOG_DIR_PREFIX}*_*"):
        owner = folder.name[len(LOG_DIR_PREFIX):].split("_", 1)[0]
        pid_text, _, _ = owner.partition("-")
        if pid_text.isdigit() and _process_tag(int(pid_text)) != owner:
            shutil.rmtree(folder, ignore_errors=True)
    tag = _process_tag(os.getpid()) or f"{os.getpid()}-0"
    return Path(tempfile.mkdtemp(prefix=f"{LOG_DIR_PREFIX}{tag}_"))



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
