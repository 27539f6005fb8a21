"""Verifier worker pools (``server.workers``): a hung worker is replaced, innocent tasks are retried."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from nemo_gym_env.errors import TaskTimeout
from nemo_gym_env.server.workers import ProcessPoolRunner


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
