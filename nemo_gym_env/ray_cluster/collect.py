"""``ray_collect``: rollout collection spread over Ray workers, streamed back in order, losing nothing.

Each worker is a Ray actor with its own event loop, its own policy (built by
``policy_factory`` on the worker) and its own connection pool, playing many episodes at once
with :func:`~nemo_gym_env.rollouts.jobs.run_rollout`. The driver hands out the rollouts in chunks,
two chunks in flight per worker so none idles between chunks, and reads each chunk back as a
Ray streaming generator, one row per finished episode::

    from nemo_gym_env.policies import ScriptedPolicy
    from nemo_gym_env.ray_cluster import ray_collect

    for row in ray_collect(rows, lambda: ScriptedPolicy("math"), {"math": url}, num_workers=4):
        out.write(row)                      # rows' order, then rollout; failures as in rollouts.collect

Worker death (its process killed, its node lost): the rows it had already streamed are kept;
its unfinished rollouts go back to the queue and run on the surviving workers; a row is never
yielded twice. When every worker is gone, :class:`WorkersLost` names the rollouts left.

Server loss: given a :class:`~nemo_gym_env.ray_cluster.RayLauncher` instead of URLs, the driver
reads the launcher's current addresses as it goes and hands a moved server's new URL to every
worker; rollouts that were playing on the lost server come back as failure rows with the reason
(a resume plays them again), the next ones play on the new address.

Before any worker starts, the workers' CPUs (and GPUs) are checked against what the cluster has
free (:func:`~nemo_gym_env.ray_cluster.capacity.require`): a run that cannot fit fails at once with
the numbers, instead of queueing workers, or starving a verifier's Ray tasks, without a word.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_gym_env.errors import WorkersLost
from nemo_gym_env.protocol.defaults import MAX_STEPS, RAY_WORKER_CONCURRENCY, ROLLOUT_REQUEST_TIMEOUT_S
from nemo_gym_env.protocol.keys import TASK_INDEX_KEY
from nemo_gym_env.ray_cluster.capacity import require, spread
from nemo_gym_env.ray_cluster.connection import (
    connect,
    import_ray,
    kill_actor,
    lost_worker_errors,
    remote_class,
)
from nemo_gym_env.rollouts.identity import server_of, task_keys
from nemo_gym_env.rollouts.jobs import (
    UNREACHABLE,
    Planned,
    RolloutJob,
    RolloutOptions,
    ServerClients,
    Task,
    expand,
    run_rollout,
    skipping,
)
from nemo_gym_env.rollouts.plan import route_row

__all__ = ["WorkersLost", "ray_collect"]

Key = int
"""The rollout's place in the run's expansion (rows' order, then rollout index): the driver's own handle on it."""


@dataclass(frozen=True)
class _WorkerSettings:
    """What every worker is handed whole: how rollouts are played, and the worker's own bounds."""

    options: RolloutOptions
    concurrency: int
    request_timeout_s: float
    unreachable_wait_s: float


class _RolloutWorker:
    """One Ray worker (an async actor: its own event loop); wrapped by ``ray.remote`` on first use."""

    def __init__(self, policy_factory: Callable[[], Any], server_urls: dict[str, str], routes: dict[str, str],
                 settings: _WorkerSettings):
        self._policy_factory = policy_factory
        self._policy: Any = None
        self._server_urls = server_urls
        self._routes = routes
        self._settings = settings
        self._clients = ServerClients(server_urls, timeout_s=settings.request_timeout_s)
        self._slots = asyncio.Semaphore(settings.concurrency)  # shared by this worker's chunks

    def where(self) -> dict[str, Any]:
        import ray  # the optional dependency: only inside a Ray worker

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    async def retarget(self, urls: dict[str, str]) -> list[str]:
        """Servers placed again elsewhere: the rollouts that start from now on use ``urls``."""
        self._server_urls.update(urls)
        return self._clients.retarget(urls)

    async def run(self, chunk: list[tuple[Key, Planned]]) -> Any:
        """Play a chunk of rollouts; yield ``(key, row)`` for each finished one (an output or a failure row)."""
        if self._policy is None:
            self._policy = self._policy_factory()
        settings = self._settings

        def job(planned: Planned) -> RolloutJob:
            name = route_row(planned.row, self._server_urls, self._routes)
            return RolloutJob.of(planned, self._clients[name], self._policy, name)

        async def play(key: Key, planned: Planned) -> tuple[Key, dict[str, Any]]:
            async with self._slots:  # the worker's bound, over all its chunks in flight
                loop = asyncio.get_running_loop()
                patience = loop.time() + settings.unreachable_wait_s
                while True:
                    row = await run_rollout(job(planned), settings.options)
                    if row.get("failure_kind") != UNREACHABLE or loop.time() >= patience:
                        return key, row
                    await asyncio.sleep(1.0)  # nothing was played: again, on the server's address by then

        tasks = [asyncio.ensure_future(play(key, spec)) for key, spec in chunk]
        try:
            for next_done in asyncio.as_completed(tasks):
                yield await next_done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(eq=False)
class _Worker:
    handle: Any
    index: int
    streams: dict[Any, list[Key]] = field(default_factory=dict)  # generator -> its chunk's keys


def ray_collect(
    rows: Sequence[dict[str, Any]],
    policy_factory: Callable[[], Any],
    server_urls: str | Mapping[str, str] | Any,
    num_workers: int = 2,
    *,
    num_repeats: int = 1,
    concurrency: int = RAY_WORKER_CONCURRENCY,
    chunk_size: int | None = None,
    max_steps: int = MAX_STEPS,
    sampling: Mapping[str, Any] | None = None,
    skip: Iterable[tuple[str, str, int]] = (),
    routes: Mapping[str, str] | None = None,
    num_cpus_per_worker: float = 1.0,
    num_gpus_per_worker: float = 0.0,
    request_timeout_s: float = ROLLOUT_REQUEST_TIMEOUT_S,
    turn_timeout_s: float | None = None,
    timeout_s: float | None = None,
    address: str | None = None,
    on_worker_lost: Callable[[int, str], None] | None = None,
    unreachable_wait_s: float = 180.0,
    episode_reward: str = "verify",
    max_episode_tokens: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Roll out every row ``num_repeats`` times on ``num_workers`` Ray workers; yield rows in order.

    Args:
        rows: Task rows; a row's ``_ng_task_index`` is kept, otherwise its position is used.
        policy_factory: Builds the policy, once per worker, on the worker (so it must pickle:
            a module-level function or class, not a lambda over unpicklable state).
        server_urls: One server URL, or ``{name: url}`` with rows routed by ``agent_ref.name``, or a
            :class:`~nemo_gym_env.ray_cluster.RayLauncher` (its servers by name), whose addresses
            the run follows when a server is placed again after its node was lost.
        num_workers: Ray workers (actors), spread over the nodes.
        num_repeats: Rollouts per task (``_ng_rollout_index`` 0..n-1).
        concurrency: Episodes in flight per worker.
        chunk_size: Rollouts handed to a worker at a time (default ``concurrency``); smaller
            chunks lose less work when a worker dies and balance slow tails better.
        max_steps: Model turns before an episode is verified anyway.
        sampling: Overrides of ``responses_create_params`` (as in :func:`~nemo_gym_env.rollouts.jobs.collect`).
        skip: Identities already done, ``(server, task key, rollout index)``
            (``RolloutWriter.done`` when resuming; see :mod:`~nemo_gym_env.rollouts.identity`); the
            server of a row is its ``agent_ref.name``, or the one name of a single server.
        routes: Agent name -> server name, for rows whose ``agent_ref`` names a NeMo Gym agent.
        num_cpus_per_worker: CPUs each worker reserves (spreads workers over nodes).
        num_gpus_per_worker: GPUs each worker reserves (a local model per worker).
        request_timeout_s: Timeout of each server request.
        turn_timeout_s: Timeout of each policy turn.
        episode_reward: A row's ``reward``: ``"verify"`` (the server's) or ``"sum"`` (plus the step
            rewards), as in :func:`~nemo_gym_env.rollouts.jobs.collect`.
        max_episode_tokens: What one episode may generate in all (as ``rollouts --max-episode-tokens``).
        timeout_s: Give up (``TimeoutError``, naming the rollouts left) after this long.
        address: The cluster (see :func:`~nemo_gym_env.ray_cluster.connect`).
        on_worker_lost: Called with (worker index, reason) when a worker dies.
        unreachable_wait_s: Given a launcher, how long a rollout whose server cannot be reached
            at its start (nothing was played) keeps trying, every second, on the server's current
            address: a lost server being placed again costs only the rollouts that were playing on it.

    Yields:
        Output rows (the ``/verify`` reply with ``_ng_task_index``, ``_ng_task_key``,
        ``_ng_rollout_index``) and failure rows (:func:`~nemo_gym_env.rollouts.output.is_failure`),
        in the order of ``rows`` then rollout index, each exactly once.

    Raises:
        ClusterCapacityError: The workers' CPUs or GPUs do not fit in what the cluster has free.
        WorkersLost: Every worker died with rollouts left (``missing`` holds their identities).
        TimeoutError: ``timeout_s`` passed with rollouts left.
    """
    if num_workers < 1 or concurrency < 1 or num_repeats < 1:
        raise ValueError("num_workers, concurrency and num_repeats must be >= 1")
    ray = import_ray()
    connect(address)
    follow = server_urls if hasattr(server_urls, "urls") else None  # a RayLauncher: its current addresses

    def current() -> dict[str, str]:
        given = follow.urls if follow is not None else server_urls
        mapping = {"server": given} if isinstance(given, str) else dict(given)
        return {name: url.rstrip("/") for name, url in mapping.items()}

    urls = current()
    # A row that names no server fails here (route_row), not on a worker.
    tasks = [Task(int(row.get(TASK_INDEX_KEY, position)), key, row, server_of(row) or route_row(row, urls, routes))
             for position, (row, key) in enumerate(zip(rows, task_keys(rows)))]
    jobs: dict[Key, Planned] = dict(enumerate(expand(tasks, num_repeats, sampling=sampling, is_done=skipping(skip))))
    order = sorted(jobs)
    size = chunk_size or concurrency
    queue: deque[list[Key]] = deque(order[i:i + size] for i in range(0, len(order), size))
    settings = _WorkerSettings(
        RolloutOptions(max_steps=max_steps, turn_timeout_s=turn_timeout_s, episode_reward=episode_reward,
                       max_episode_tokens=max_episode_tokens),
        concurrency=concurrency, request_timeout_s=request_timeout_s,
        # Following a launcher: a server that cannot be reached is being placed again; wait for it.
        unreachable_wait_s=0.0 if follow is None else unreachable_wait_s)
    if jobs:
        require(f"ray_collect: {num_workers} worker(s) of {num_cpus_per_worker:g} CPU and {num_gpus_per_worker:g} GPU",
                [(num_cpus_per_worker, num_gpus_per_worker)] * num_workers, wait_s=5.0)
    places = spread([(num_cpus_per_worker, num_gpus_per_worker)] * num_workers)  # the nodes in turn
    workers = [_Worker(remote_class(_RolloutWorker).options(
        num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker, scheduling_strategy=place, max_restarts=0,
    ).remote(policy_factory, urls, dict(routes or {}), settings), i) for i, place in enumerate(places)]
    finished: set[Key] = set()  # received from a worker (yielded, or waiting for its turn)
    waiting: dict[Key, dict[str, Any]] = {}
    next_at = 0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def hand_out() -> None:
        for worker in sorted(workers, key=lambda w: len(w.streams)):
            while queue and len(worker.streams) < 2:
                keys = queue.popleft()
                chunk = [(key, jobs[key]) for key in keys]
                stream = worker.handle.run.options(num_returns="streaming").remote(chunk)
                worker.streams[stream] = list(keys)

    def lose(worker: _Worker, reason: str) -> None:
        workers.remove(worker)
        left = sorted({k for keys in worker.streams.values() for k in keys if k not in finished})
        for start in reversed(range(0, len(left), size)):  # to the front, oldest first: they hold up the order
            queue.appendleft(left[start:start + size])
        kill_actor(ray, worker.handle)
        if on_worker_lost is not None:
            on_worker_lost(worker.index, reason)

    def left() -> list[tuple[str, str, int]]:
        return [(jobs[k].task.server, jobs[k].task.key, jobs[k].rollout_index) for k in order if k not in finished]

    try:
        hand_out()
        while next_at < len(order):
            if not workers:
                missing = left()
                raise WorkersLost(f"all {num_workers} Ray rollout workers died; {len(missing)} rollouts left "
                                  f"(first: {missing[:5]})", missing)
            if deadline is not None and time.monotonic() > deadline:
                missing = left()
                raise TimeoutError(f"ray_collect: {len(missing)} rollouts left after {timeout_s:g} s "
                                   f"(first: {missing[:5]})")
            if follow is not None:
                now = current()
                if now != urls:  # a server was placed again: the rollouts that start next go there
                    urls = now
                    for worker in workers:
                        worker.handle.retarget.remote(now)
            owners = {stream: worker for worker in workers for stream in worker.streams}
            ready, _ = ray.wait(list(owners), num_returns=len(owners), timeout=0)  # everything ready now...
            if not ready:
                ready, _ = ray.wait(list(owners), num_returns=1, timeout=1.0)  # ...or wait for the next one
            for stream in ready:
                worker = owners[stream]
                if worker not in workers:
                    continue  # lost while this round read another of its streams
                try:
                    key, row = ray.get(next(stream))
                except StopIteration:
                    del worker.streams[stream]
                    continue
                except lost_worker_errors(ray) as exc:
                    lose(worker, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                    continue
                if key in jobs and key not in finished:  # a late duplicate of a re-run rollout stays out
                    finished.add(key)
                    waiting[key] = row
            hand_out()
            while next_at < len(order) and order[next_at] in waiting:
                yield waiting.pop(order[next_at])
                next_at += 1
    finally:
        for worker in workers:
            kill_actor(ray, worker.handle)

