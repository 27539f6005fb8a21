"""Run CPU-heavy, possibly hanging functions off the event loop: a process pool, or Ray tasks.

A verifier awaits :meth:`TaskRunner.run`; the event loop stays free while the work runs in
another process, and a task that overruns its time limit raises :class:`TaskTimeout`::

    runner = ProcessPoolRunner(workers=2)
    await runner.start()                                   # optional: spawn the workers now
    assert await runner.run(pow, 2, 10, timeout_s=5.0) == 1024
    await runner.aclose()

Why a pool that is thrown away: a worker stuck in a long SymPy (or regex) computation cannot
be interrupted from outside, and ``concurrent.futures`` cannot cancel a running task. On a
timeout the runner kills that pool's processes and starts a fresh pool, so later tasks never
queue behind a hung worker; tasks that were running on the killed pool are retried once on
the new one. Functions must be importable by name (module-level) so a spawned worker can
unpickle them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import logging
import multiprocessing
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from nemo_gym_env.errors import TaskTimeout

__all__ = [
    "ProcessPoolRunner",
    "RayRunner",
    "TaskRunner",
    "TaskTimeout",
    "default_workers",
    "ray_missing_message",
]

logger = logging.getLogger("nemo_gym_env.server.workers")


def default_workers() -> int:
    """``min(4, cpu_count)``: enough to keep verification off the critical path, no more."""
    return max(1, min(4, os.cpu_count() or 1))


def ray_missing_message() -> str | None:
    """Why Ray tasks cannot be used here (``None`` when ``ray`` is importable)."""
    if importlib.util.find_spec("ray") is None:
        return "ray_address is set but ray is not installed: pip install 'nemo-gym-env[ray]'"
    return None


class TaskRunner(ABC):
    """Runs module-level functions in other processes with a per-task time limit."""

    @abstractmethod
    async def start(self) -> None:
        """Start the workers, or fail if they cannot be had (optional: :meth:`run` starts them too)."""

    @abstractmethod
    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` in a worker; raises :class:`TaskTimeout` after ``timeout_s`` seconds."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stop the workers; tasks still running are abandoned."""


def _ready() -> int:
    return os.getpid()


class ProcessPoolRunner(TaskRunner):
    """A ``ProcessPoolExecutor`` (spawned workers) that is replaced whenever a task overruns.

    At most ``workers`` tasks run at once; others wait on the event loop (not in the pool's
    queue), so a task's time limit counts from when a worker is free for it.

    Args:
        workers: Number of worker processes.
        initializer: Run once in each worker before it takes tasks (imports, warm-up), so that
            cost does not count against any task's time limit.
    """

    def __init__(self, workers: int, *, initializer: Callable[[], Any] | None = None):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        self._initializer = initializer
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._ready: asyncio.Future | None = None
        self._slots: asyncio.Semaphore | None = None
        self.pools_started = 0
        """How many pools this runner has created (1 + the number of replacements)."""

    def _current(self) -> tuple[concurrent.futures.ProcessPoolExecutor, asyncio.Future]:
        if self._pool is None or self._ready is None:
            context = multiprocessing.get_context("spawn")  # no inherited sockets, threads or secrets
            pool = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=self._initializer
            )
            # One no-op per worker spawns them all now; tasks wait until one has answered, so
            # start-up and imports do not eat into the first task's time limit.
            pings = [asyncio.wrap_future(pool.submit(_ready)) for _ in range(self.workers)]
            ready = asyncio.gather(*pings)
            ready.add_done_callback(_retrieve)  # a pool killed while starting must not log "never retrieved"
            self._pool, self._ready = pool, ready
            self.pools_started += 1
        return self._pool, self._ready

    async def start(self) -> None:
        """Spawn the workers now, without waiting for ``initializer``: the first task finds them warm."""
        self._current()

    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` in a worker; a task that overruns ``timeout_s`` kills and replaces the pool."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        async with self._slots:
            for attempt in range(2):
                pool, ready = self._current()
                try:
                    await asyncio.shield(ready)
                    future = asyncio.wrap_future(pool.submit(fn, *args))
                except (BrokenProcessPool, RuntimeError):  # broken, or shut down by another task's timeout
                    self._discard(pool)
                    if attempt:
                        raise
                    continue
                done, _ = await asyncio.wait({future}, timeout=timeout_s)
                if not done:
                    self._discard(pool)
                    raise TaskTimeout(f"task did not finish within {timeout_s:g} s; its worker was stopped")
                try:
                    return future.result()
                except BrokenProcessPool:  # killed under us (another task's timeout) or crashed
                    self._discard(pool)
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    def _discard(self, pool: concurrent.futures.ProcessPoolExecutor) -> None:
        """Kill ``pool``'s processes; the next task starts a fresh pool."""
        if self._pool is pool:
            self._pool, self._ready = None, None
        _kill_pool(pool)

    async def aclose(self) -> None:
        """Kill the workers (a hung one would block a graceful shutdown forever)."""
        if self._pool is not None:
            self._discard(self._pool)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _kill_pool(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    # ProcessPoolExecutor has no public way to stop a running task; its worker table is the
    # only handle on the processes. The executor's manager thread reaps them and fails the
    # futures still pending with BrokenProcessPool.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        try:
            process.kill()
        except (OSError, ValueError, AttributeError):
            pass


class RayRunner(TaskRunner):
    """Ray tasks on a cluster (``address`` as for ``ray.init``: ``"auto"``, ``"ray://host:10001"``, ...),
    in CPUs the runner reserves for them.

    :meth:`start` joins the cluster and reserves a placement group of ``slots`` bundles of
    ``num_cpus`` each, ``SPREAD`` over the nodes: the tasks run only there, at most ``slots`` at a
    time, so the CPUs they need are held before anything else on the cluster (rollout workers that
    take every free CPU, say) can starve them, and a task's time limit counts from when it can run.
    Before :meth:`start` returns, a worker is started in each bundle and the initializer run there,
    so the first tasks' limits are not spent starting processes and importing. A reservation the
    cluster cannot hold fails :meth:`start` with the numbers. The reservation
    goes with the process (Ray removes a job's placement groups when its driver exits) or with
    :meth:`aclose`.

    A task that overruns its limit is cancelled with ``force=True``, which kills its worker.
    ``ray`` is imported here, not at module import, so it stays an optional dependency.

    Args:
        address: The cluster to join; ``"local"`` starts a private one.
        num_cpus: CPUs reserved per task.
        slots: Tasks that may run at once (the bundles reserved).
        label: Who reserves, in the placement group's name and in errors (``"math verifier"``).
        reserve_timeout_s: How long to wait for the cluster to place the reservation.
        initializer: Run once in each Ray worker process before its first task (imports,
            warm-up), as ``ProcessPoolRunner``'s initializer, so that cost is not charged to
            the first task a fresh worker takes.
    """

    def __init__(self, address: str, *, num_cpus: float = 1.0, slots: int = 1, label: str = "verifier",
                 reserve_timeout_s: float = 60.0, initializer: Callable[[], Any] | None = None):
        missing = ray_missing_message()
        if missing:
            raise RuntimeError(missing)
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.address = address
        self.num_cpus = num_cpus
        self.slots = slots
        self.label = label
        self.reserve_timeout_s = reserve_timeout_s
        self._initializer = initializer
        self._ray = importlib.import_module("ray")
        self._remotes: dict[Callable[..., Any], Any] = {}
        self._group: Any = None
        self._free: asyncio.Semaphore | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Join the cluster and reserve the tasks' CPUs (once).

        Raises:
            RuntimeError: The cluster cannot hold the reservation within ``reserve_timeout_s``
                (the message says how many CPUs it has and how many are free).
        """
        async with self._lock:
            if self._group is not None:
                return
            ray = self._ray
            if not ray.is_initialized():
                await asyncio.to_thread(ray.init, address=self.address, ignore_reinit_error=True, log_to_driver=False)
            name = f"nemo_gym_env {self.label} (pid {os.getpid()})"
            group = ray.util.placement_group([{"CPU": self.num_cpus}] * self.slots, strategy="SPREAD", name=name)
            try:
                await asyncio.to_thread(ray.get, group.ready(), timeout=self.reserve_timeout_s)
            except Exception as exc:  # noqa: BLE001 - a timeout, or a cluster that went away: both say the same
                ray.util.remove_placement_group(group)
                total = ray.cluster_resources().get("CPU", 0.0)
                free = ray.available_resources().get("CPU", 0.0)
                raise RuntimeError(
                    f"{self.label}: cannot reserve {self.slots * self.num_cpus:g} CPU(s) for its Ray tasks "
                    f"({self.slots} x {self.num_cpus:g}) on the cluster at {self.address} within "
                    f"{self.reserve_timeout_s:g} s ({type(exc).__name__}): the cluster has {total:g} CPU(s), "
                    f"{free:g} free; start this server before the rollout workers, ask for fewer task slots, "
                    "or add nodes") from None
            self._group = group
            self._free = asyncio.Semaphore(self.slots)
            await self._warm_up()

    async def _warm_up(self) -> None:
        """Start a worker in every bundle and run the initializer there, so the first verifications'
        time limits are not spent starting processes and importing (a warning if it takes too long)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        refs = [self._ray.remote(_warm_call).options(
            num_cpus=self.num_cpus, max_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index),
        ).remote(self._initializer, _ready) for index in range(self.slots)]
        try:
            await asyncio.to_thread(self._ray.get, refs, timeout=self.reserve_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the tasks will start their workers themselves
            logger.warning("%s: warming up its Ray workers: %s: %s", self.label, type(exc).__name__, exc)

    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` as a Ray task in the reservation; cancelled (worker killed) after ``timeout_s``
        from when it could start."""
        await self.start()
        assert self._free is not None
        async with self._free:
            remote = self._remotes.get(fn)
            if remote is None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=-1)
                remote = self._remotes[fn] = self._ray.remote(_warm_call).options(
                    num_cpus=self.num_cpus, max_retries=0, scheduling_strategy=strategy)
            ref = remote.remote(self._initializer, fn, *args)
            future = asyncio.wrap_future(ref.future())
            done, _ = await asyncio.wait({future}, timeout=timeout_s)
            if not done:
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:  # already finished or gone: nothing left to stop
                    logger.debug("ray.cancel failed", exc_info=True)
                raise TaskTimeout(f"Ray task did not finish within {timeout_s:g} s; it was cancelled")
            return future.result()

    async def aclose(self) -> None:
        """Give the reservation back; the Ray connection stays (other code in the process may use it)."""
        self._remotes.clear()
        group, self._group = self._group, None
        if group is not None:
            try:
                self._ray.util.remove_placement_group(group)
            except Exception:  # the cluster or the connection is gone: so is the reservation
                logger.debug("remove_placement_group failed", exc_info=True)


_warmed = False


def _warm_call(initializer: Callable[[], Any] | None, fn: Callable[..., Any], *args: Any) -> Any:
    """A Ray task: ``initializer()`` once per worker process, then ``fn(*args)``."""
    global _warmed
    if initializer is not None and not _warmed:
        initializer()
        _warmed = True
    return fn(*args)
