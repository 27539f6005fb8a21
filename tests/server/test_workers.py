"""Verifier worker pools (``server.workers``): a hung worker is replaced, innocent tasks are retried."""

from __future__ import annotations

import functools
import gc
import os
import signal
import time
from collections.abc import Iterator

import pytest

from nemo_gym_env.errors import TaskLost, TaskTimeout
from nemo_gym_env.server.workers import ProcessPoolRunner, RayRunner


@pytest.fixture(autouse=True)
def _collect_what_a_killed_pool_leaves() -> Iterator[None]:
    """Collect, at the end of the test that made them, the futures a killed pool leaves behind.

    A task caught in a replaced pool leaves an asyncio future holding ``BrokenProcessPool``
    that nobody retrieves; asyncio logs it, with its traceback, when it is collected. Collected
    in a later test while that test is in ``ast.parse`` (Python 3.11 formats tracebacks with
    ``ast``), the nested parse makes the outer one fail with ``SystemError``.
    """
    yield
    gc.collect()


@pytest.mark.slow
def test_pool_replaces_a_hung_worker() -> None:
    import asyncio

    async def scenario() -> None:
        runner = ProcessPoolRunner(1)
        try:
            assert await runner.run(pow, 2, 10, timeout_s=60) == 1024
            started = time.monotonic()
            with pytest.raises(TaskTimeout):
                await runner.run(time.sleep, 60, timeout_s=0.5)
            assert time.monotonic() - started < 5
            # The only worker was stuck; the next task runs on a fresh pool at once.
            assert await runner.run(pow, 3, 3, timeout_s=60) == 27
            assert runner.pools_started == 2
        finally:
            await runner.aclose()

    asyncio.run(scenario())


@pytest.mark.slow
def test_pool_retries_tasks_caught_in_a_replaced_pool() -> None:
    import asyncio

    async def scenario() -> None:
        runner = ProcessPoolRunner(2)
        try:
            await runner.start()
            hung = asyncio.ensure_future(runner.run(time.sleep, 60, timeout_s=1.0))
            innocent = asyncio.ensure_future(runner.run(time.sleep, 1.5, timeout_s=30))
            with pytest.raises(TaskTimeout):
                await hung
            assert await innocent is None  # killed with the pool, then run again on the new one
        finally:
            await runner.aclose()

    asyncio.run(scenario())


@pytest.mark.slow
def test_ray_runner_charges_a_task_only_its_own_time_and_replaces_a_lost_worker() -> None:
    """On a real local Ray: a worker that takes 3 s to start (cold process, imports) does not eat a
    1 s limit; a task that overruns is killed (TaskTimeout); a worker killed mid-task is a TaskLost,
    not a result; either way the next task runs on a fresh worker."""
    import asyncio

    ray = pytest.importorskip("ray")
    was_connected = ray.is_initialized()

    async def scenario() -> None:
        runner = RayRunner("local", slots=1, label="test verifier", initializer=functools.partial(time.sleep, 3.0))
        try:
            await runner.start()
            first = await runner.run(os.getpid, timeout_s=1.0)  # the start-up was not charged to it
            assert runner.workers_started == 1
            with pytest.raises(TaskTimeout) as overran:
                await runner.run(time.sleep, 60, timeout_s=1.0)
            assert not isinstance(overran.value, TaskLost) and "did not finish within 1 s" in str(overran.value)
            second = await runner.run(os.getpid, timeout_s=1.0)  # a fresh worker, its 3 s start not charged either
            assert second != first and runner.workers_started == 2
            hung = asyncio.ensure_future(runner.run(time.sleep, 60, timeout_s=120))
            await asyncio.sleep(1.0)
            os.kill(second, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(TaskLost, match="was lost"):
                await hung
            assert time.monotonic() - started < 30
            third = await runner.run(os.getpid, timeout_s=1.0)
            assert third not in (first, second) and runner.workers_started == 3
            assert await runner.run(pow, 2, 10, timeout_s=1.0) == 1024
        finally:
            await runner.aclose()

    try:
        asyncio.run(scenario())
    finally:
        if not was_connected:  # the private Ray this test started: stop it, or it outlives the test
            ray.shutdown()
