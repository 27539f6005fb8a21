"""BatchGenerator without a model: batching, cancellation, failures and shutdown, with a stand-in model.

The stand-in's ``generate`` appends the row's own index (plus a marker) so each caller can check
that it got exactly its own row back. The real model's path is in ``test_local_batching.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from nemo_gym_env.errors import PolicyError  # noqa: E402
from nemo_gym_env.policies.batching import BatchGenerator, GenerationRequest, available_cpus  # noqa: E402

END = 2


class StandIn:
    """Generates ``[first prompt token + 100, END]`` for every row; can block or raise on demand."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls: list[int] = []  # batch sizes
        self.fail_on: set[int] = set()  # call numbers (0-based) that raise
        self.die_on: set[int] = set()  # call numbers that end the worker thread
        self.gate = threading.Event()
        self.gate.set()

    def generate(self, ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: object) -> SimpleNamespace:
        call = len(self.calls)
        self.calls.append(ids.shape[0])
        assert self.gate.wait(30)
        if call in self.die_on:
            raise SystemExit("the worker thread ends")
        if call in self.fail_on:
            raise RuntimeError("deliberate failure")
        first = torch.tensor([int(row[mask.bool()][0]) for row, mask in zip(ids, attention_mask)])
        return SimpleNamespace(
            sequences=torch.cat([ids, (first + 100)[:, None], torch.full((ids.shape[0], 1), END)], dim=1))


def _request(token: int, length: int = 3, budget: int = 8) -> GenerationRequest:
    return GenerationRequest(prompt=[token] * length, temperature=0.0, top_p=1.0, max_new_tokens=budget, seed=0)


async def _all(generator: BatchGenerator, requests: list[GenerationRequest]) -> list:
    return await asyncio.gather(*(generator.generate(r) for r in requests), return_exceptions=True)


def test_concurrent_requests_share_a_batch_and_each_gets_its_own_row():
    model = StandIn()
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, max_batch_size=4, wait_s=0.2)
    results = asyncio.run(_all(generator, [_request(10 + n, length=1 + n) for n in range(6)]))
    assert [r.token_ids for r in results] == [[110 + n, END] for n in range(6)]
    assert model.calls == [4, 2]  # capped at max_batch_size, the rest in the next batch
    assert [r.batch_size for r in results] == [4, 4, 4, 4, 2, 2]
    stats = generator.stats.as_dict()
    assert stats["batches"] == 2 and stats["rows"] == 6 and stats["batch_sizes"] == {2: 1, 4: 1}
    assert stats["prompt_tokens"] == sum(range(1, 7)) and stats["computed_prompt_tokens"] == 4 * 4 + 2 * 6
    assert stats["generated_tokens"] == 12
    generator.close()


def test_a_batch_waits_for_a_prompt_still_being_prepared():
    model = StandIn()
    preparing = [1]
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, wait_s=0.02, preparing=lambda: preparing[0])

    async def main() -> list:
        first = asyncio.ensure_future(generator.generate(_request(1)))
        await asyncio.sleep(0.3)  # far longer than wait_s: only the announced preparation holds the batch
        preparing[0] = 0
        second = asyncio.ensure_future(generator.generate(_request(2)))
        return await asyncio.gather(first, second)

    first, second = asyncio.run(main())
    assert model.calls == [2] and first.token_ids == [101, END] and second.token_ids == [102, END]
    generator.close()


def test_a_row_is_cut_at_its_budget():
    generator = BatchGenerator(StandIn(), end_ids={END}, pad_id=0)
    (result,) = asyncio.run(_all(generator, [_request(7, budget=1)]))
    assert result.token_ids == [107]
    generator.close()


def test_a_failing_batch_fails_its_requests_only():
    model = StandIn()
    model.fail_on = {0}
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, max_batch_size=2, wait_s=0.2)
    results = asyncio.run(_all(generator, [_request(n) for n in range(4)]))
    assert model.calls == [2, 2]
    for failed in results[:2]:
        assert isinstance(failed, PolicyError)
        assert "failed on a batch of 2 turn(s): RuntimeError: deliberate failure" in str(failed)
    assert [r.token_ids for r in results[2:]] == [[102, END], [103, END]]
    assert generator.stats.failed_batches == 1
    # the worker goes on
    (again,) = asyncio.run(_all(generator, [_request(5)]))
    assert again.token_ids == [105, END]
    generator.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread does die
def test_a_dead_worker_is_reported_not_awaited_forever_and_replaced():
    model = StandIn()
    model.die_on = {0}
    generator = BatchGenerator(model, end_ids={END}, pad_id=0)
    started = time.monotonic()
    (lost,) = asyncio.run(_all(generator, [_request(1)]))
    assert isinstance(lost, PolicyError) and "worker stopped" in str(lost)
    assert time.monotonic() - started < 30  # bounded (the poll interval, not a hang)
    (result,) = asyncio.run(_all(generator, [_request(3)]))  # a new worker
    assert result.token_ids == [103, END]
    generator.close()


def test_a_request_cancelled_while_queued_is_skipped():
    model = StandIn()
    model.gate.clear()  # the first batch blocks until the gate opens
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, max_batch_size=1, wait_s=0)

    async def main() -> list:
        first = asyncio.ensure_future(generator.generate(_request(1)))
        while not model.calls:
            await asyncio.sleep(0.01)
        doomed = asyncio.ensure_future(generator.generate(_request(2)))
        kept = asyncio.ensure_future(generator.generate(_request(3)))
        await asyncio.sleep(0.05)
        doomed.cancel()
        model.gate.set()
        return await asyncio.gather(first, doomed, kept, return_exceptions=True)

    first, doomed, kept = asyncio.run(main())
    assert first.token_ids == [101, END] and kept.token_ids == [103, END]
    assert isinstance(doomed, asyncio.CancelledError)
    assert model.calls == [1, 1]  # the cancelled request never reached the model
    generator.close()


def test_close_fails_later_requests_and_stops_the_thread():
    generator = BatchGenerator(StandIn(), end_ids={END}, pad_id=0)
    (done,) = asyncio.run(_all(generator, [_request(4)]))
    assert done.token_ids == [104, END]
    thread = generator._thread
    generator.close()
    assert not thread.is_alive()
    with pytest.raises(PolicyError, match="closed"):
        generator.submit(_request(5))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchGenerator(StandIn(), end_ids={END}, pad_id=0, max_batch_size=0)
    with pytest.raises(ValueError, match="num_threads"):
        BatchGenerator(StandIn(), end_ids={END}, pad_id=0, num_threads=0)
    with pytest.raises(ValueError, match="end_ids"):
        BatchGenerator(StandIn(), end_ids=set(), pad_id=0)
    generator = BatchGenerator(StandIn(), end_ids={END}, pad_id=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generator.submit(_request(1, budget=0))
    with pytest.raises(ValueError, match="empty"):
        generator.submit(GenerationRequest(prompt=[], temperature=0.0, top_p=1.0, max_new_tokens=4))


def test_threads_default_to_the_available_cpus_unless_set(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert BatchGenerator(StandIn(), end_ids={END}, pad_id=0).num_threads == available_cpus()
    assert BatchGenerator(StandIn(), end_ids={END}, pad_id=0, num_threads=1).num_threads == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an explicit setting (Ray sets it per worker) stands
    assert BatchGenerator(StandIn(), end_ids={END}, pad_id=0).num_threads == torch.get_num_threads()


def test_a_dropped_generator_frees_its_worker():
    generator = BatchGenerator(StandIn(), end_ids={END}, pad_id=0)
    asyncio.run(_all(generator, [_request(1)]))
    thread = generator._thread
    del generator
    thread.join(10)
    assert not thread.is_alive()
