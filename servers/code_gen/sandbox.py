"""Run one untrusted Python program in a limited child process, without blocking the event loop.

::

    sandbox = Sandbox(Limits(timeout_s=2), max_concurrent=4)
    run = await sandbox.run("print(int(input()) * 2)", stdin="21\\n")
    run.kind, run.stdout          # ('ok', b'42\\n')

Each run gets a fresh scratch directory (removed afterwards, also after a timeout) and a new
``python -I -S -B -X utf8`` interpreter (isolated mode: no user site, no ``PYTHON*``
variables, no current directory on ``sys.path``; no ``site``, so no third-party packages),
started in its own session with a minimal environment and these limits, which ``_bootstrap.py``
applies with ``resource.setrlimit`` as its first statement, before it reads the program:

==================  ==========================================================================
``RLIMIT_CPU``      ``ceil(timeout_s)`` seconds (SIGXCPU), hard limit one second later (SIGKILL)
``RLIMIT_AS``       ``memory_bytes`` of address space (``MemoryError`` past it)
``RLIMIT_FSIZE``    ``max_file_bytes`` per written file (SIGXFSZ past it)
``RLIMIT_NPROC``    ``max_processes`` for the user (not enforced for root: the audit hook is the barrier)
``RLIMIT_NOFILE``   256 open files; ``RLIMIT_CORE`` 0 (no core dumps)
==================  ==========================================================================

A wall-clock timeout kills the whole process group (``os.killpg``). Standard output beyond
``max_output_bytes`` kills the program (``output_limit``); standard error is kept up to 64 KiB.
Inside the child, ``_bootstrap.py`` installs an audit hook before the program runs; see there
and the README for what it denies and what it cannot stop.

The limits travel as arguments, not in a ``preexec_fn``: with a ``preexec_fn`` Python must
``fork()`` the server, copying its page tables for every test run, and only without one can it
``vfork()`` (a trivial run started from a process holding 2 GiB: 132 ms forked, 18 ms by
``vfork``; ``benchmarks/sandbox_start.py``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["BOOTSTRAP", "DENIED_MARKER", "Limits", "RunKind", "RunResult", "Sandbox", "run_sandboxed"]

BOOTSTRAP = (Path(__file__).with_name("_bootstrap.py")).read_text(encoding="utf-8")
"""Source of the in-child bootstrap, passed with ``-c`` (no file of ours on the child's path)."""

DENIED_MARKER = b"[sandbox] denied:"
"""What the bootstrap writes to stderr when the audit hook refuses an operation."""

_EXIT_SYNTAX, _EXIT_MEMORY, _EXIT_BAD_RETURN = 101, 102, 103
_FILE_TOO_LARGE = f"[Errno {errno.EFBIG}]".encode()
_STDERR_CAP = 64 * 1024
_CHUNK = 64 * 1024

RunKind = Literal[
    "ok", "timeout", "memory", "runtime_error", "syntax_error", "output_limit", "forbidden", "bad_return",
    "sandbox_lost",
]


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run.

    Attributes:
        timeout_s: Wall-clock limit; also the CPU-time limit (rounded up to whole seconds).
        memory_bytes: Address-space limit (``RLIMIT_AS``).
        max_output_bytes: Standard output beyond this kills the program (``output_limit``).
        max_file_bytes: Largest file the program may write (``RLIMIT_FSIZE``).
        max_processes: ``RLIMIT_NPROC`` (processes and threads of the user; root is exempt).
    """

    timeout_s: float = 10.0
    memory_bytes: int = 1 << 30
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_processes: int = 128


@dataclass
class RunResult:
    """What one run did.

    Attributes:
        kind: ``ok`` (exit status 0) or why not: ``timeout``, ``memory``, ``runtime_error``,
            ``syntax_error``, ``output_limit``, ``forbidden`` (the audit hook refused an
            operation and the program died of it), ``bad_return`` (call mode: not JSON);
            ``sandbox_lost`` when the run (a Ray task) never came back, which says nothing of the program.
        returncode: The exit status (negative: killed by that signal).
        stdout: Standard output, at most ``max_output_bytes``.
        stderr: Standard error, at most 64 KiB.
        result: Call mode: the JSON text of the return value, else ``None``.
        wall_s: Seconds from start to reaped.
        truncated: Standard output went past ``max_output_bytes`` (the program was killed).
    """

    kind: RunKind
    returncode: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    result: bytes | None = None
    wall_s: float = 0.0
    truncated: bool = field(default=False)


def _limit_arguments(limits: Limits) -> list[str]:
    """The bootstrap's arguments after MODE and SCRATCH: CPU seconds, address space, file size and
    process count (``_bootstrap._apply_limits`` sets them, plus 256 open files and no core dumps)."""
    cpu = max(1, math.ceil(limits.timeout_s))
    return [str(cpu), str(limits.memory_bytes), str(limits.max_file_bytes), str(limits.max_processes)]


def _remove_tree(path: str) -> None:
    """Remove a scratch directory, however deep or locked down the program left it."""
    try:
        shutil.rmtree(path)
    except (OSError, RecursionError):
        pass
    if os.path.lexists(path):  # deeper than rmtree's recursion, or modes the program removed
        subprocess.run(["chmod", "-R", "u+rwX", "--", path], capture_output=True, check=False, timeout=120)
        subprocess.run(["rm", "-rf", "--", path], capture_output=True, check=False, timeout=120)


def _kill_group(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Sandbox:
    """Runs programs under :class:`Limits`, at most ``max_concurrent`` at a time.

    Args:
        limits: Limits of every run.
        max_concurrent: Runs in flight at once (a semaphore; the rest wait their turn).
        scratch_root: Where scratch directories are made (default: the system's temp dir).
    """

    def __init__(self, limits: Limits, max_concurrent: int = 4, scratch_root: str | None = None):
        self.limits = limits
        self.max_concurrent = max_concurrent
        self.scratch_root = scratch_root
        self._semaphore = asyncio.Semaphore(max_concurrent)

    async def run(
        self, code: str, *, stdin: str = "", call: tuple[str, list[Any]] | None = None
    ) -> RunResult:
        """Run ``code`` as a script reading ``stdin``, or (``call=(fn_name, args)``) call its function."""
        async with self._semaphore:
            scratch = tempfile.mkdtemp(prefix="nemo-gym-code-", dir=self.scratch_root)
            try:
                return await self._run_in(scratch, code, stdin, call)
            finally:
                await asyncio.to_thread(_remove_tree, scratch)

    async def _run_in(
        self, scratch: str, code: str, stdin: str, call: tuple[str, list[Any]] | None
    ) -> RunResult:
        Path(scratch, "solution.py").write_text(code, encoding="utf-8", errors="surrogatepass")
        if call is not None:
            Path(scratch, "call.json").write_text(
                json.dumps({"fn_name": call[0], "args": call[1]}), encoding="utf-8"
            )
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
        limits = self.limits
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-B", "-X", "utf8", "-c", BOOTSTRAP,
            "call" if call is not None else "stdio", scratch, *_limit_arguments(limits),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=scratch,
            env=env,
            start_new_session=True,
        )  # fmt: skip
        overflow = asyncio.Event()
        timed_out = False
        try:
            stdout, stderr = await asyncio.wait_for(
                self._communicate(proc, stdin, overflow), limits.timeout_s
            )
        except TimeoutError:
            timed_out = True
            stdout = stderr = b""
        finally:
            _kill_group(proc.pid)
            await proc.wait()
        wall_s = time.perf_counter() - started
        result = None
        if call is not None and proc.returncode == 0:
            result_path = Path(scratch, ".result.json")
            if result_path.is_file() and result_path.stat().st_size <= limits.max_output_bytes:
                result = result_path.read_bytes()
        kind = _classify(proc.returncode, stderr, timed_out=timed_out, overflow=overflow.is_set())
        if kind == "ok" and call is not None and result is None:
            kind = "runtime_error"  # exited 0 without a result: the program called exit() first
        return RunResult(kind, proc.returncode, stdout, stderr, result, wall_s, overflow.is_set())

    async def _communicate(
        self, proc: asyncio.subprocess.Process, stdin: str, overflow: asyncio.Event
    ) -> tuple[bytes, bytes]:
        async def feed() -> None:
            if proc.stdin is None:
                return
            try:
                proc.stdin.write(stdin.encode("utf-8", "surrogatepass"))
                await proc.stdin.drain()
                proc.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the program exited without reading all of its input

        def on_stdout_overflow() -> None:
            overflow.set()
            _kill_group(proc.pid)

        _, stdout, stderr = await asyncio.gather(
            feed(),
            _read_capped(proc.stdout, self.limits.max_output_bytes, on_stdout_overflow),
            _read_capped(proc.stderr, _STDERR_CAP, None),
        )
        await proc.wait()
        return stdout, stderr


def run_sandboxed(code: str, stdin: str, call: tuple[str, list[Any]] | None, limits: Limits,
                  scratch_root: str | None = None) -> RunResult:
    """One sandboxed run, from synchronous code: the body of a Ray task (the same sandbox, on
    whichever node runs the task)."""
    return asyncio.run(Sandbox(limits, 1, scratch_root).run(code, stdin=stdin, call=call))


async def _read_capped(stream: asyncio.StreamReader, cap: int, on_overflow: Any) -> bytes:
    """Read to EOF, keeping at most ``cap`` bytes; call ``on_overflow`` once past it."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(_CHUNK):
        if size < cap:
            chunks.append(chunk[: cap - size])
        size += len(chunk)
        if size > cap and on_overflow is not None:
            on_overflow()
            on_overflow = None
    return b"".join(chunks)


def _classify(returncode: int | None, stderr: bytes, *, timed_out: bool, overflow: bool) -> RunKind:
    if timed_out:
        return "timeout"
    if overflow:
        return "output_limit"
    if returncode == 0:
        return "ok"
    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "timeout"  # CPU limit: SIGXCPU at the soft limit, SIGKILL at the hard one
        if sig == signal.SIGXFSZ:
            return "output_limit"
        return "memory" if b"MemoryError" in stderr else "runtime_error"
    if returncode == _EXIT_MEMORY:
        return "memory"
    if returncode == _EXIT_SYNTAX:
        return "syntax_error"
    if returncode == _EXIT_BAD_RETURN:
        return "bad_return"
    if DENIED_MARKER in stderr:
        return "forbidden"
    if _FILE_TOO_LARGE in stderr:
        return "output_limit"  # Python ignores SIGXFSZ: the write past RLIMIT_FSIZE fails with EFBIG
    return "runtime_error"
