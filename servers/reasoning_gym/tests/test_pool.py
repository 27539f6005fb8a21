"""The worker pool: results, errors, hard timeouts, crashes, closing."""

from __future__ import annotations

import asyncio
import operator
import os
import pickle
import time

import pytest

from nemo_gym_env.servers.reasoning_gym.pool import (
    PoolClosed,
    WorkerCrashed,
    WorkerError,
    WorkerPool,
    WorkerTimeout,
)


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2) as p:
        yield p


def test_call_returns_the_result(pool: WorkerPool) -> None:
    assert pool.call(operator.add, 2, 3, timeout=60) == 5
    assert pool.map(pow, [(2, 3), (3, 2), (5, 0)], timeout=60) == [8, 9, 1]


def test_workers_hash_with_seed_0(pool: WorkerPool) -> None:
    assert pool.call(os.getenv, "PYTHONHASHSEED", timeout=60) == "0"
    assert pool.call(hash, "reasoning", timeout=60) == pool.call(hash, "reasoning", timeout=60)
    assert pool.call(os.getenv, "OPENBLAS_NUM_THREADS", timeout=60) == os.environ.get(
        "OPENBLAS_NUM_THREADS", "1"
    )


def test_an_exception_in_the_worker_is_a_worker_error(pool: WorkerPool) -> None:
    with pytest.raises(WorkerError, match="ZeroDivisionError"):
        pool.call(operator.truediv, 1, 0, timeout=60)
    assert pool.call(operator.add, 1, 1, timeout=60) == 2


def test_unpicklable_arguments_leave_the_workers_alone(pool: WorkerPool) -> None:
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        pool.call(operator.add, lambda: 1, 1, timeout=60)
    assert pool.call(operator.add, 1, 1, timeout=60) == 2


def test_timeout_kills_and_replaces_the_worker(pool: WorkerPool) -> None:
    started = time.perf_counter()
    with pytest.raises(WorkerTimeout):
        pool.call(time.sleep, 60, timeout=0.5)
    assert time.perf_counter() - started < 5.0
    # The other worker answers at once; the replacement joins when it has started.
    assert pool.map(operator.add, [(i, i) for i in range(6)], timeout=120) == [0, 2, 4, 6, 8, 10]


def test_a_dying_worker_is_a_crash_and_is_replaced(pool: WorkerPool) -> None:
    with pytest.raises(WorkerCrashed):
        pool.call(os._exit, 3, timeout=60)
    assert pool.call(operator.mul, 6, 7, timeout=120) == 42


def test_acall_does_not_block_the_event_loop(pool: WorkerPool) -> None:
    async def main() -> tuple[float, float]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        started = time.perf_counter()
        await asyncio.gather(*(pool.acall(time.sleep, 0.3, timeout=60) for _ in range(2)))
        task.cancel()
        return ticks, time.perf_counter() - started

    ticks, elapsed = asyncio.run(main())
    assert ticks >= 10 and elapsed < 5.0


def test_closed_pool_refuses_calls() -> None:
    pool = WorkerPool(1)
    assert pool.call(operator.neg, 1, timeout=120) == -1
    pool.close()
    pool.close()
    assert pool.closed
    with pytest.raises(PoolClosed):
        pool.call(operator.neg, 1, timeout=1)


def test_a_failing_preload_is_reported() -> None:
    with (
        WorkerPool(1, preload=["no_such_module_here"], start_timeout_s=30) as pool,
        pytest.raises(WorkerCrashed, match="no_such_module_here"),
    ):
        pool.call(operator.neg, 1, timeout=1)


def test_memory_limit_gives_memory_error() -> None:
    with WorkerPool(1, memory_mb=512) as pool:
        with pytest.raises(WorkerError, match="MemoryError"):
            pool.call(bytearray, 2 * 1024**3, timeout=60)
        assert pool.call(len, bytearray(1024), timeout=60) == 1024


def test_bad_size() -> None:
    with pytest.raises(ValueError):
        WorkerPool(0)
