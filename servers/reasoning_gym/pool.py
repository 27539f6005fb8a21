"""Worker processes with a hard per-call timeout, for generating and scoring tasks.

Example:
    >>> import operator
    >>> with WorkerPool(1) as pool:
    ...     pool.call(operator.add, 2, 3, timeout=60)
    5

Why not ``concurrent.futures.ProcessPoolExecutor``: a call that runs away must be stopped,
and the executor cannot kill the process of one task. (reasoning-gym's ``countdown`` scorer
hands the model's answer to sympy; ``9**9**9**9`` never comes back.) Here each call checks
out one worker; past its timeout that worker is killed and replaced in the background, and
only that call fails, with :class:`WorkerTimeout`.

Workers are plain ``python -c`` subprocesses talking over a socket pair, not
``multiprocessing`` children: nothing re-imports the caller's ``__main__`` (a script without
an ``if __name__ == "__main__"`` guard, or code piped to ``python -``, works), the
environment is given to the child rather than edited in this process, and the workers stay
in this process's group, so whoever stops the group (the launcher) stops them too. A
worker whose parent dies reads end-of-file and exits.

Workers are started with ``PYTHONHASHSEED=0``. A few reasoning-gym generators iterate over
sets of strings, so the questions they write depend on the interpreter's hash seed; with a
fixed seed a task regenerates identically in every process that asks (the dataset
generator, the server, the scripted player), whatever hash seed that process itself has.
BLAS libraries are held to one thread per worker: the workers are the parallelism.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any, Self

__all__ = ["WORKER_ENV", "PoolClosed", "WorkerCrashed", "WorkerError", "WorkerPool", "WorkerTimeout"]

logger = logging.getLogger("nemo_gym_env.servers.reasoning_gym.pool")

WORKER_ENV = {"PYTHONHASHSEED": "0"}
"""Environment every worker starts with (on top of the parent's)."""

_THREAD_ENV_DEFAULTS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_START_ATTEMPTS = 3


class WorkerTimeout(TimeoutError):
    """The call did not finish within its timeout; its worker was killed and is being replaced."""


class WorkerError(RuntimeError):
    """The function raised inside the worker; the message is ``"<ExceptionType>: <message>"``."""


class WorkerCrashed(RuntimeError):
    """The worker died during the call, or no worker could be started."""


class PoolClosed(RuntimeError):
    """The pool was closed."""


# The worker needs this module and the functions it is sent, not the packages above it: their
# __init__ files import the whole library (openai types, gymnasium: seconds per start). So it
# registers them as bare packages (their __path__ only) before importing this module.
_CHILD_CODE = (
    "import json, sys, types; spec = json.loads(sys.argv[1]); sys.path[:0] = spec['sys_path']\n"
    "for name, path in spec['packages'].items():\n"
    "    module = types.ModuleType(name); module.__path__ = path; module.__package__ = name\n"
    "    sys.modules.setdefault(name, module)\n"
    "__import__(spec['module'], fromlist=['_worker_main'])._worker_main(spec)"
)


def _bare_packages() -> dict[str, list[str]]:
    """``__path__`` of every package above this module, outermost first."""
    parts = __name__.split(".")[:-1]
    names = [".".join(parts[: i + 1]) for i in range(len(parts))]
    return {
        name: list(sys.modules[name].__path__) for name in names if hasattr(sys.modules.get(name), "__path__")
    }


def _worker_main(spec: dict[str, Any]) -> None:
    """Main loop of a worker process (see ``_CHILD_CODE``): serve calls over the inherited socket.

    Receives ``(fn, args)``, sends back ``("ok", result)`` or ``("error", text)``; exits when
    the parent closes the socket (or dies).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(spec["fd"])
    preload, memory_mb = spec["preload"], spec["memory_mb"]
    try:
        for module in preload:
            importlib.import_module(module)
        if memory_mb:
            import resource

            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit if hard < 0 else min(limit, hard), hard))
    except BaseException as exc:  # tell the parent why, rather than dying silently
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the parent closed the socket or died
            return
        except Exception as exc:
            conn.send(("error", f"cannot unpickle the call: {type(exc).__name__}: {exc}"))
            continue
        try:
            result: tuple[str, Any] = ("ok", fn(*args))
        except Exception as exc:
            result = ("error", f"{type(exc).__name__}: {exc}")
        try:
            data = ForkingPickler.dumps(result)
        except Exception as exc:
            data = ForkingPickler.dumps(
                ("error", f"the result cannot be sent back: {type(exc).__name__}: {exc}")
            )
        try:
            conn.send_bytes(data)
        except OSError:
            return


class _Worker:
    """One worker process and the parent's end of its socket."""

    def __init__(self, preload: tuple[str, ...], memory_mb: int | None, start_timeout_s: float):
        parent_sock, child_sock = socket.socketpair()
        env = {**_THREAD_ENV_DEFAULTS, **os.environ, **WORKER_ENV}
        spec = {
            "sys_path": [p for p in sys.path if p],
            "packages": _bare_packages(),
            "module": __name__,
            "fd": child_sock.fileno(),
            "preload": preload,
            "memory_mb": memory_mb,
        }
        args = [sys.executable, "-c", _CHILD_CODE, json.dumps(spec)]
        try:
            # Same process group as this one: whoever stops this process's group stops the workers.
            self.process = subprocess.Popen(
                args, env=env, stdin=subprocess.DEVNULL, pass_fds=(child_sock.fileno(),)
            )
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        self.conn = Connection(parent_sock.detach())
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise WorkerCrashed(f"a worker did not start within {start_timeout_s:g} s")
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.kill()
            raise WorkerCrashed(f"a worker exited while starting (exit code {self.process.poll()})") from None
        if status != "ready":
            self.kill()
            raise WorkerCrashed(f"a worker failed to start: {value}")

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


class WorkerPool:
    """A fixed number of worker processes; each call runs in one, with a hard timeout.

    Args:
        workers: Number of worker processes.
        preload: Modules each worker imports before it reports ready (so the first call is
            not charged for them).
        memory_mb: Address-space limit of each worker (``RLIMIT_AS``); ``None`` for none.
            Past it, allocations in the worker raise ``MemoryError``.
        start_timeout_s: How long a worker may take to start, and how long a call waits
            for a free worker before giving up.

    Calls are thread-safe. Functions and arguments must be picklable (module-level
    functions); results too. Workers are stopped by :meth:`close`, when the pool is
    garbage-collected, or at interpreter exit.
    """

    def __init__(
        self,
        workers: int,
        *,
        preload: Sequence[str] = (),
        memory_mb: int | None = None,
        start_timeout_s: float = 120.0,
    ):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.preload = tuple(preload)
        self.memory_mb = memory_mb
        self.start_timeout_s = start_timeout_s
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._starting = 0
        self._last_start_error: str | None = None
        self._closed = threading.Event()
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reasoning-gym-call")
        # Also runs at interpreter exit (weakref.finalize's default), killing the workers.
        self._finalizer = weakref.finalize(
            self, _close, self._closed, self._idle, self._all, self._lock, self._threads, workers
        )
        for _ in range(workers):
            self._start_in_background()

    # ---- calls ---------------------------------------------------------------------------

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """Run ``fn(*args)`` in a worker and return its result.

        Raises:
            WorkerTimeout: It ran past ``timeout`` seconds (the worker was killed).
            WorkerError: ``fn`` raised in the worker.
            WorkerCrashed: The worker died during the call, or no worker could be started.
            PoolClosed: The pool is closed.
        """
        data = ForkingPickler.dumps((fn, args))  # a pickling error leaves every worker untouched
        worker = self._checkout()
        name = getattr(fn, "__name__", repr(fn))
        try:
            worker.conn.send_bytes(data)
            finished = worker.conn.poll(timeout)
            if finished:
                status, value = worker.conn.recv()
        except (EOFError, OSError) as exc:
            self._replace(worker)
            if self._closed.is_set():
                raise PoolClosed("the worker pool was closed during the call") from None
            raise WorkerCrashed(
                f"a worker died during {name} (exit code {worker.exitcode}): {exc!r}"
            ) from None
        except BaseException:
            self._replace(worker)
            raise
        if not finished:
            self._replace(worker)
            raise WorkerTimeout(f"{name} did not finish within {timeout:g} s; its worker was killed")
        self._idle.put(worker)
        if status == "error":
            raise WorkerError(value)
        return value

    async def acall(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """:meth:`call` without blocking the event loop (the wait happens in a thread)."""
        if self._closed.is_set():
            raise PoolClosed("the worker pool is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._threads, functools.partial(self.call, fn, *args, timeout=timeout)
        )

    def map(
        self, fn: Callable[..., Any], arg_tuples: Iterable[tuple], timeout: float | None = None
    ) -> list[Any]:
        """``[fn(*args) for args in arg_tuples]``, spread over the workers, in order."""
        return list(self._threads.map(lambda args: self.call(fn, *args, timeout=timeout), arg_tuples))

    # ---- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every worker; calls in flight fail with :class:`PoolClosed`. Safe to call twice."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed.is_set()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals -----------------------------------------------------------------------

    def _checkout(self) -> _Worker:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._closed.is_set():
                raise PoolClosed("the worker pool is closed")
            try:
                worker = self._idle.get(timeout=0.5)
            except queue.Empty:
                with self._lock:
                    hopeless = not self._all and not self._starting
                if hopeless or time.monotonic() > deadline:
                    raise WorkerCrashed(
                        f"no worker available within {self.start_timeout_s:g} s"
                        + (
                            f"; last start failure: {self._last_start_error}"
                            if self._last_start_error
                            else ""
                        )
                    ) from None
                continue
            if worker is None:  # close() wakes waiters with None
                raise PoolClosed("the worker pool is closed")
            return worker

    def _replace(self, worker: _Worker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.kill()
        self._start_in_background()

    def _start_in_background(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._starting += 1
        threading.Thread(target=self._start_one, name="reasoning-gym-worker-start", daemon=True).start()

    def _start_one(self) -> None:
        try:
            for attempt in range(_START_ATTEMPTS):
                if self._closed.is_set():
                    return
                try:
                    worker = _Worker(self.preload, self.memory_mb, self.start_timeout_s)
                except Exception as exc:
                    self._last_start_error = str(exc)
                    logger.error(
                        "worker start failed (attempt %d of %d): %s", attempt + 1, _START_ATTEMPTS, exc
                    )
                    time.sleep(1.0)
                    continue
                with self._lock:
                    if self._closed.is_set():
                        worker.kill()
                        return
                    self._all.add(worker)
                self._idle.put(worker)
                return
        finally:
            with self._lock:
                self._starting -= 1


def _close(
    closed: threading.Event,
    idle: queue.Queue,
    workers: set[_Worker],
    lock: threading.Lock,
    threads: ThreadPoolExecutor,
    thread_count: int,
) -> None:
    closed.set()
    with lock:
        doomed = list(workers)
        workers.clear()
    for worker in doomed:
        worker.kill()
    for _ in range(len(doomed) + thread_count):
        idle.put(None)
    threads.shutdown(wait=False, cancel_futures=True)
