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

from nemo_gym_env.errors import ClusterCapacityError, ClusterConnectionError, TaskLost, TaskTimeout
from nemo_gym_env.system.ray_join import check_cluster, lost_worker_errors

__all__ = [
    "ProcessPoolRunner",
    "RayRunner",
    "TaskLost",
    "TaskRunner",
    "TaskTimeout",
    "default_workers",
    "ray_missing_message",
]

logger = logging.getLogger("nemo_gym_env.server.workers")


def default_workers() -> int:
    """Half the CPUs, 1 to 4: verification off the event loop, with cores left for the model and the
    other servers that share the machine (each worker is a Python process of ~100 MB)."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


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
    """Ray workers on a cluster (``address`` as for ``ray.init``: ``"auto"``, ``"ray://host:10001"``, ...),
    in CPUs the runner reserves for them.

    :meth:`start` joins the cluster, reserves a placement group of ``slots`` bundles of
    ``num_cpus`` each, ``SPREAD`` over the nodes, and starts one worker (a Ray actor) in each
    bundle, its initializer run there. The CPUs the tasks need are held before anything else on
    the cluster (rollout workers that take every free CPU, say) can starve them, at most
    ``slots`` tasks run at a time, and a task's time limit counts from when its worker is up and
    idle: starting a process and importing (seconds on a cold, loaded node) is never charged to
    a task, neither to the first ones nor to the one after a worker was replaced. A reservation
    the cluster cannot hold fails :meth:`start` with the numbers. The reservation goes with the
    process (Ray removes a job's placement groups when its driver exits) or with :meth:`aclose`.

    A task that overruns its limit raises :class:`TaskTimeout` and its worker is killed; a worker
    lost while it runs a task (its process killed, its node gone) raises :class:`TaskLost`. Either
    way the task gave no result, and the bundle gets a fresh worker for the next task (on a live
    node: Ray places a lost node's bundles again). ``ray`` is imported here, not at module
    import, so it stays an optional dependency.

    Args:
        address: The cluster to join; ``"local"`` starts a private one.
        num_cpus: CPUs reserved per task.
        slots: Tasks that may run at once (the bundles reserved, one worker each).
        label: Who reserves, in the placement group's name and in errors (``"math verifier"``).
        reserve_timeout_s: How long to wait for the cluster to place the reservation, and for a
            worker to start (a task whose worker cannot start in that time raises :class:`TaskLost`).
        initializer: Run once in each worker process before its first task (imports, warm-up),
            as ``ProcessPoolRunner``'s initializer.
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
        self._group: Any = None
        self._idle: asyncio.Queue[_RaySlot] | None = None
        self._slots: list[_RaySlot] = []
        self._lock = asyncio.Lock()
        self.workers_started = 0
        """Workers (actors) started so far: ``slots`` at start, one more for each one replaced."""

    async def start(self) -> None:
        """Join the cluster, reserve the tasks' CPUs and start a worker in each bundle (once).

        Raises:
            ClusterConnectionError: The cluster cannot be joined (nothing at the address, a missing or
                wrong token): the message says what to set.
            ClusterCapacityError: The cluster cannot hold the reservation within ``reserve_timeout_s``
                (the message says how many CPUs it has and how many are free).
        """
        async with self._lock:
            if self._group is not None:
                return
            ray = self._ray
            if not ray.is_initialized():
                try:
                    await asyncio.to_thread(check_cluster, self.address)  # a missing token, nothing there: at once
                    await asyncio.to_thread(ray.init, address=self.address, ignore_reinit_error=True,
                                            log_to_driver=False)
                except ClusterConnectionError as exc:
                    raise ClusterConnectionError(f"{self.label}: {exc}") from None
                except ConnectionError as exc:
                    raise ClusterConnectionError(f"{self.label}: cannot join the Ray cluster at {self.address}: "
                                                 f"{exc}") from None
            name = f"nemo_gym_env {self.label} (pid {os.getpid()})"
            group = ray.util.placement_group([{"CPU": self.num_cpus}] * self.slots, strategy="SPREAD", name=name)
            try:
                await asyncio.to_thread(ray.get, group.ready(), timeout=self.reserve_timeout_s)
            except Exception as exc:  # noqa: BLE001 - a timeout, or a cluster that went away: both say the same
                ray.util.remove_placement_group(group)
                total = ray.cluster_resources().get("CPU", 0.0)
                free = ray.available_resources().get("CPU", 0.0)
                raise ClusterCapacityError(
                    f"{self.label}: cannot reserve {self.slots * self.num_cpus:g} CPU(s) for its Ray tasks "
                    f"({self.slots} x {self.num_cpus:g}) on the cluster at {self.address} within "
                    f"{self.reserve_timeout_s:g} s ({type(exc).__name__}): the cluster has {total:g} CPU(s), "
                    f"{free:g} free; start this server before the rollout workers, ask for fewer task slots, "
                    "or add nodes") from None
            self._group = group
            self._slots = [_RaySlot(index) for index in range(self.slots)]
            self._idle = asyncio.Queue()
            for slot in self._slots:
                self._idle.put_nowait(slot)
            # Every worker up before the first task; one that cannot start yet is tried again by run().
            for outcome in await asyncio.gather(*(self._up(slot) for slot in self._slots), return_exceptions=True):
                if isinstance(outcome, TaskLost):
                    logger.warning("%s", outcome)
                elif isinstance(outcome, BaseException):
                    raise outcome

    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        """``fn(*args)`` on an idle worker of the reservation, limited to ``timeout_s`` from when it runs there.

        Raises:
            TaskTimeout: It did not finish in time; its worker was killed (a fresh one takes its place).
            TaskLost: Its worker died, or no worker could be started within ``reserve_timeout_s``.
        """
        await self.start()
        assert self._idle is not None
        slot = await self._idle.get()
        try:
            handle = await self._up(slot)  # a worker started now is not charged to the task
            ref = handle.call.remote(fn, *args)
            future = _quiet(asyncio.wrap_future(ref.future()))
            done, _ = await asyncio.wait({future}, timeout=timeout_s)
            if not done:
                self._retire(slot)
                raise TaskTimeout(f"Ray task did not finish within {timeout_s:g} s; its worker was killed")
            try:
                return future.result()
            except lost_worker_errors(self._ray) as exc:
                self._retire(slot)
                raise TaskLost(f"the Ray worker running the task was lost ({type(exc).__name__}: "
                               f"{_first_line(exc)})") from None
        finally:
            self._idle.put_nowait(slot)

    async def _up(self, slot: _RaySlot) -> Any:
        """The slot's worker, started (and its initializer run) if it has none."""
        if slot.handle is None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            remote = self._ray.remote(_RayWorker).options(
                num_cpus=self.num_cpus, max_restarts=0, max_concurrency=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=slot.index),
            )
            slot.handle = remote.remote(self._initializer)
            slot.ready = _quiet(asyncio.wrap_future(slot.handle.ready.remote().future()))
            self.workers_started += 1
        assert slot.ready is not None
        done, _ = await asyncio.wait({slot.ready}, timeout=self.reserve_timeout_s)
        try:
            if not done:
                raise TimeoutError(f"not up within reserve_timeout_s={self.reserve_timeout_s:g} s")
            slot.ready.result()
        except Exception as exc:  # noqa: BLE001 - could not start, or its initializer raised: no worker there
            self._retire(slot)
            raise TaskLost(f"{self.label}: its Ray worker in bundle {slot.index} did not start "
                           f"({type(exc).__name__}: {_first_line(exc)})") from None
        return slot.handle

    def _retire(self, slot: _RaySlot) -> None:
        handle, slot.handle, slot.ready = slot.handle, None, None
        if handle is not None:
            try:
                self._ray.kill(handle, no_restart=True)
            except Exception:  # already gone
                logger.debug("ray.kill failed", exc_info=True)

    async def aclose(self) -> None:
        """Stop the workers and give the reservation back; the Ray connection stays (other code in the
        process may use it)."""
        for slot in self._slots:
            self._retire(slot)
        self._slots, self._idle = [], None
        group, self._group = self._group, None
        if group is not None:
            try:
                self._ray.util.remove_placement_group(group)
            except Exception:  # the cluster or the connection is gone: so is the reservation
                logger.debug("remove_placement_group failed", exc_info=True)


class _RaySlot:
    """One bundle of a :class:`RayRunner`'s reservation and the worker in it (None: none yet)."""

    def __init__(self, index: int):
        self.index = index
        self.handle: Any = None
        self.ready: asyncio.Future | None = None


class _RayWorker:
    """A :class:`RayRunner` worker (a Ray actor, wrapped by ``ray.remote`` on use): the initializer
    once, then one task at a time."""

    def __init__(self, initializer: Callable[[], Any] | None):
        if initializer is not None:
            initializer()

    def ready(self) -> int:
        return os.getpid()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


def _quiet(future: asyncio.Future) -> asyncio.Future:
    """``future``, its exception marked retrieved: one given up on (a killed worker's) logs nothing."""
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    return future


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""
