"""BatchGenerator: the running batch with a tiny random Llama (fast, the real decoding path), and the
fixed-batch path with a stand-in model; batching, joining mid-batch, cancellation, failures, shutdown.

The real embedded model's path is in ``test_local_batching.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from nemo_gym_env.errors import PolicyError  # noqa: E402
from nemo_gym_env.policies.attention import use_decode_attention  # noqa: E402
from nemo_gym_env.policies.batching import BatchGenerator, GenerationRequest, available_cpus  # noqa: E402
from nemo_gym_env.policies.decoding import Row, RunningBatch  # noqa: E402
from nemo_gym_env.policies.kv_cache import cache_keyword, prefill  # noqa: E402

END = 2


def tiny_llama() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval()


class Flaky:
    """A model that delegates to ``model`` and can block, raise or end its thread on chosen forward calls."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.calls: list[tuple[int, int]] = []  # (rows, tokens) of each forward pass
        self.fail_when: Any = lambda rows, tokens, n: False
        self.die_when: Any = lambda rows, tokens, n: False
        self.gate = threading.Event()
        self.gate.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, *, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        rows, tokens = input_ids.shape
        self.calls.append((rows, tokens))
        assert self.gate.wait(30)
        if self.die_when(rows, tokens, len(self.calls)):
            raise SystemExit("the worker thread ends")
        if self.fail_when(rows, tokens, len(self.calls)):
            raise RuntimeError("deliberate failure")
        return self._model(input_ids=input_ids, **kwargs)

    def steps(self) -> list[int]:
        """Rows of each decoding step (forward passes of one token per row)."""
        return [rows for rows, tokens in self.calls if tokens == 1]


def _request(token: int, length: int = 5, budget: int = 8, **sampling: Any) -> GenerationRequest:
    prompt = [(token + 7 * n) % 90 + 3 for n in range(length)]
    return GenerationRequest(prompt=prompt, temperature=sampling.get("temperature", 0.0),
                             top_p=sampling.get("top_p", 1.0), max_new_tokens=budget, seed=sampling.get("seed", 0))


async def _all(generator: BatchGenerator, requests: list[GenerationRequest]) -> list:
    return await asyncio.gather(*(generator.generate(r) for r in requests), return_exceptions=True)


def _alone(model: Any, requests: list[GenerationRequest]) -> list:
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, prefix_cache_mb=0)

    async def main() -> list:
        return [await generator.generate(r) for r in requests]

    try:
        return asyncio.run(main())
    finally:
        generator.close()


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_llama()


# ---- the running batch ---------------------------------------------------------------------------


def test_concurrent_turns_decode_together_each_with_its_own_tokens(model):
    requests = [_request(n, length=3 + 2 * n, budget=4 + n) for n in range(6)]
    alone = _alone(model, requests)
    flaky = Flaky(model)
    generator = BatchGenerator(flaky, end_ids={END}, pad_id=0, max_batch_size=4, wait_s=0.2, prefix_cache_mb=0)
    together = asyncio.run(_all(generator, requests))
    generator.close()
    for a, b, request in zip(alone, together, requests):
        assert b.token_ids == a.token_ids and 1 <= len(b.token_ids) <= request.max_new_tokens
        assert b.log_probs == pytest.approx(a.log_probs, abs=1e-4)
    assert max(flaky.steps()) == 4  # capped at max_batch_size, the others joined as rows left
    stats = generator.stats.as_dict()
    assert stats["rows"] == 6 and stats["mean_batch"] > 1
    assert stats["generated_tokens"] == sum(len(t.token_ids) for t in together)
    assert stats["computed_prompt_tokens"] == stats["prompt_tokens"] == sum(len(r.prompt) for r in requests)


def test_a_turn_joins_a_batch_that_is_already_decoding(model):
    flaky = Flaky(model)
    generator = BatchGenerator(flaky, end_ids=set(range(90, 96)) | {END}, pad_id=0, wait_s=0.01, prefix_cache_mb=0)
    long, short = _request(1, budget=60), _request(2, length=9, budget=5)

    async def main() -> list:
        first = asyncio.ensure_future(generator.generate(long))
        while len(flaky.steps()) < 3:
            await asyncio.sleep(0.005)
        second = asyncio.ensure_future(generator.generate(short))
        return await asyncio.gather(first, second)

    first, second = asyncio.run(main())
    generator.close()
    assert 2 in flaky.steps()  # the second turn decoded alongside the first, which had started alone
    assert [first.token_ids, second.token_ids] == [a.token_ids for a in _alone(model, [long, short])]


def test_seeded_sampling_does_not_depend_on_the_batch(model):
    requests = [_request(n, budget=10, temperature=0.9, top_p=0.9, seed=40 + n) for n in range(4)]
    alone = _alone(model, requests)
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, wait_s=0.2)
    together = asyncio.run(_all(generator, requests))
    generator.close()
    assert [t.token_ids for t in together] == [a.token_ids for a in alone]
    assert generator.stats.as_dict()["mean_batch"] > 1


def test_a_group_of_one_prompt_is_prefilled_once_and_the_cache_keeps_finished_turns_only(model):
    """Copies arriving together reuse the first copy's prompt states; once the batch holds them the cache
    lets them go (a second copy of the running batch), and takes each finished turn back."""
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, wait_s=0.2)
    request = _request(9, length=30, budget=6)
    outputs = asyncio.run(_all(generator, [request] * 4))
    generator.close()
    stats = generator.stats.as_dict()
    assert stats["computed_prompt_tokens"] == len(request.prompt) + 3  # once, then the last token of each copy
    assert stats["cached_prompt_tokens"] == 3 * (len(request.prompt) - 1)
    finished = {tuple(request.prompt + out.token_ids[:-1]) for out in outputs}
    # Finished turns only (one entry per distinct turn: an equal one replaces its twin), no prompt alone.
    assert len(generator.prefix_cache) == len(finished)
    assert generator.prefix_cache.longest(request.prompt + outputs[0].token_ids[:-1])[0] == \
        len(request.prompt) + len(outputs[0].token_ids) - 1


def test_a_later_turn_computes_only_its_new_tokens(model):
    generator = BatchGenerator(model, end_ids={END}, pad_id=0)
    first_request = _request(5, length=20, budget=6)
    (first,) = asyncio.run(_all(generator, [first_request]))
    extended = first_request.prompt + first.token_ids + [11, 12, 13]
    (second,) = asyncio.run(_all(generator, [GenerationRequest(extended, 0.0, 1.0, 4, 0)]))
    (fresh,) = _alone(model, [GenerationRequest(extended, 0.0, 1.0, 4, 0)])
    generator.close()
    stats = generator.stats.as_dict()
    seen = len(first_request.prompt) + len(first.token_ids)
    assert stats["cached_prompt_tokens"] == seen - 1  # all but the last generated token, never computed
    assert stats["computed_prompt_tokens"] == len(first_request.prompt) + len(extended) - (seen - 1)
    assert second.token_ids == fresh.token_ids


def test_a_failing_step_fails_the_turns_in_it_only(model):
    flaky = Flaky(model)
    flaky.fail_when = lambda rows, tokens, n: tokens == 1 and rows == 3 and not failed
    failed: list = []
    generator = BatchGenerator(flaky, end_ids={END}, pad_id=0, max_batch_size=3, wait_s=0.2, prefix_cache_mb=0)
    results = asyncio.run(_all(generator, [_request(n, budget=4) for n in range(3)]))
    failed.append(True)
    for result in results:
        assert isinstance(result, PolicyError)
        assert "failed on a batch of 3 turn(s): RuntimeError: deliberate failure" in str(result)
    again = asyncio.run(_all(generator, [_request(n, budget=4) for n in range(2)]))  # the worker goes on
    assert [a.token_ids for a in again] == [a.token_ids for a in _alone(model, [_request(n, budget=4) for n in range(2)])]
    assert generator.stats.failed_steps == 1
    generator.close()


def test_a_failing_prefill_fails_that_turn_only(model):
    flaky = Flaky(model)
    flaky.fail_when = lambda rows, tokens, n: tokens == 8  # the prefill of the 9-token prompt
    generator = BatchGenerator(flaky, end_ids={END}, pad_id=0, wait_s=0.2, prefix_cache_mb=0)
    bad, good = asyncio.run(_all(generator, [_request(1, length=9), _request(2, length=5)]))
    generator.close()
    assert isinstance(bad, PolicyError) and "prefilling a turn: RuntimeError" in str(bad)
    assert good.token_ids == _alone(model, [_request(2, length=5)])[0].token_ids


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread does die
def test_a_dead_worker_is_reported_not_awaited_forever_and_replaced(model):
    flaky = Flaky(model)
    flaky.die_when = lambda rows, tokens, n: n == 1
    generator = BatchGenerator(flaky, end_ids={END}, pad_id=0)
    started = time.monotonic()
    (lost,) = asyncio.run(_all(generator, [_request(1)]))
    assert isinstance(lost, PolicyError) and "worker stopped" in str(lost)
    assert time.monotonic() - started < 30  # bounded (the poll interval, not a hang)
    (result,) = asyncio.run(_all(generator, [_request(3)]))  # a new worker
    assert result.token_ids == _alone(model, [_request(3)])[0].token_ids
    generator.close()


def test_a_cancelled_turn_leaves_the_batch_and_the_others_go_on(model):
    flaky = Flaky(model)
    generator = BatchGenerator(flaky, end_ids={END}, pad_id=0, wait_s=0.2, prefix_cache_mb=0)
    kept_request = _request(2, budget=40)

    async def main() -> list:
        doomed = asyncio.ensure_future(generator.generate(_request(1, budget=200)))
        kept = asyncio.ensure_future(generator.generate(kept_request))
        while len(flaky.steps()) < 2:
            await asyncio.sleep(0.005)
        doomed.cancel()
        return await asyncio.gather(doomed, kept, return_exceptions=True)

    doomed, kept = asyncio.run(main())
    generator.close()
    assert isinstance(doomed, asyncio.CancelledError)
    assert kept.token_ids == _alone(model, [kept_request])[0].token_ids
    assert len(flaky.steps()) < 200  # the cancelled row did not run to its budget


def test_close_stops_a_running_batch_and_refuses_later_turns(model):
    flaky = Flaky(model)
    generator = BatchGenerator(flaky, end_ids={END}, pad_id=0, prefix_cache_mb=0)

    async def main() -> Any:
        turn = asyncio.ensure_future(generator.generate(_request(1, budget=400)))
        while len(flaky.steps()) < 2:
            await asyncio.sleep(0.005)
        await asyncio.to_thread(generator.close)
        return (await asyncio.gather(turn, return_exceptions=True))[0]

    result = asyncio.run(main())
    assert isinstance(result, PolicyError) and "closed" in str(result)
    assert len(flaky.steps()) < 400 and not generator._thread.is_alive()
    with pytest.raises(PolicyError, match="closed"):
        generator.submit(_request(5))


def test_a_batch_waits_for_a_prompt_still_being_prepared(model):
    flaky = Flaky(model)
    preparing = [1]
    generator = BatchGenerator(flaky, end_ids={END}, pad_id=0, wait_s=0.02, preparing=lambda: preparing[0])

    async def main() -> list:
        first = asyncio.ensure_future(generator.generate(_request(1, budget=3)))
        await asyncio.sleep(0.3)  # far longer than wait_s: only the announced preparation holds the batch
        preparing[0] = 0
        second = asyncio.ensure_future(generator.generate(_request(2, budget=3)))
        return await asyncio.gather(first, second)

    asyncio.run(main())
    generator.close()
    assert flaky.steps()[0] == 2  # both started together


def test_a_dropped_generator_frees_its_worker(model):
    generator = BatchGenerator(model, end_ids={END}, pad_id=0)
    asyncio.run(_all(generator, [_request(1, budget=2)]))
    thread = generator._thread
    del generator
    thread.join(10)
    assert not thread.is_alive()


# ---- the fixed-batch path (models whose cache the running batch cannot rearrange) ---------------


class StandIn:
    """No config (so no running batch): ``generate`` appends ``[first prompt token + 100, END]`` to each row."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.fail = False

    def generate(self, ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append(ids.shape[0])
        if self.fail:
            raise RuntimeError("deliberate failure")
        first = torch.tensor([int(row[mask.bool()][0]) for row, mask in zip(ids, attention_mask)])
        return torch.cat([ids, (first + 100)[:, None], torch.full((ids.shape[0], 1), END)], dim=1)


def test_fixed_batches_for_models_without_a_running_batch():
    model = StandIn()
    generator = BatchGenerator(model, end_ids={END}, pad_id=0, max_batch_size=4, wait_s=0.2)
    requests = [GenerationRequest([10 + n] * (1 + n), 0.0, 1.0, 8, 0) for n in range(6)]
    results = asyncio.run(_all(generator, requests))
    assert [r.token_ids for r in results] == [[110 + n, END] for n in range(6)]
    assert model.calls == [4, 2]
    (cut,) = asyncio.run(_all(generator, [GenerationRequest([7], 0.0, 1.0, 1, 0)]))
    assert cut.token_ids == [107]  # cut at its budget
    model.fail = True
    failed = asyncio.run(_all(generator, requests[:2]))
    assert all(isinstance(f, PolicyError) and "RuntimeError: deliberate failure" in str(f) for f in failed)
    generator.close()


# ---- settings ----------------------------------------------------------------------------------------


def test_bad_settings_are_refused(model):
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchGenerator(model, end_ids={END}, pad_id=0, max_batch_size=0)
    with pytest.raises(ValueError, match="num_threads"):
        BatchGenerator(model, end_ids={END}, pad_id=0, num_threads=0)
    with pytest.raises(ValueError, match="end_ids"):
        BatchGenerator(model, end_ids=set(), pad_id=0)
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        BatchGenerator(model, end_ids={END}, pad_id=0, prefix_cache_mb=-1)
    generator = BatchGenerator(model, end_ids={END}, pad_id=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generator.submit(_request(1, budget=0))
    with pytest.raises(ValueError, match="empty"):
        generator.submit(GenerationRequest(prompt=[], temperature=0.0, top_p=1.0, max_new_tokens=4))


def test_threads_default_to_the_available_cpus_unless_set(model, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert BatchGenerator(model, end_ids={END}, pad_id=0).num_threads == available_cpus()
    assert BatchGenerator(model, end_ids={END}, pad_id=0, num_threads=1).num_threads == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an explicit setting (Ray sets it per worker) stands
    assert BatchGenerator(model, end_ids={END}, pad_id=0).num_threads == torch.get_num_threads()


# ---- groups of rows of similar length ----------------------------------------------------------------


def _rows_of(model: Any, prompts: list[list[int]], budget: int | list[int], first: int = 0) -> list[tuple[Row, Any]]:
    keyword = cache_keyword(model)
    budgets = budget if isinstance(budget, list) else [budget] * len(prompts)
    return [(Row(key=first + n, prompt=prompt, temperature=0.0, top_p=1.0, budget=budgets[n],
                 generator=torch.Generator()), prefill(model, prompt[:-1], None, keyword))
            for n, prompt in enumerate(prompts)]


def _decode(batch: RunningBatch, on_step: Any = lambda step: None) -> dict[Any, list[int]]:
    done: dict[Any, list[int]] = {}
    step = 0
    while batch.rows:
        batch.step()
        step += 1
        on_step(step)
        for row in batch.pop_finished():
            done[row.key] = row.tokens
    return done


def test_rows_of_very_different_lengths_decode_in_groups_with_the_tokens_they_give_alone():
    """Short and long prompts go to groups of their own (each padded to its own longest row), and the large
    groups' attention takes the matrix products: every row still gets the tokens it gets alone, while rows
    leave early, later rows join groups mid-decode and the buffers grow past their room."""
    model = tiny_llama()
    use_decode_attention(model)
    prompts = [_request(n, length=length).prompt for n, length in enumerate([6, 9, 350, 360, 355, 150, 160, 8])]
    budgets = [4, 80, 80, 4, 80, 80, 4, 80]
    later = [_request(n, length=length).prompt for n, length in enumerate([358, 152, 7], start=20)]
    with torch.inference_mode():
        alone = {n: _decode(_batch_of(model, [(row, states)]))[n]
                 for n, (row, states) in enumerate(_rows_of(model, prompts + later, budgets + [70, 70, 70]))}
        batch = _batch_of(model, _rows_of(model, prompts, budgets))
        groups = batch.groups
        real, padded = batch.positions
        seen: list[list[tuple[int, int]]] = []

        def join_later(step: int) -> None:
            if step == 6:
                batch.add(_rows_of(model, later, 70, first=len(prompts)))
            seen.append(batch.groups)

        together = _decode(batch, join_later)
    assert together == alone
    assert len(groups) == 3 and sorted(rows for rows, _ in groups) == [2, 3, 3]
    assert padded < 1.1 * real  # one group would pad every row to 359 positions: 2x
    assert any(rows * width >= 1024 for rows, width in groups)  # the matrix products' path was taken
    assert len(seen[5]) == 3 and sum(rows for rows, _ in seen[5]) == sum(rows for rows, _ in seen[4]) + 3
    assert max(width for step in seen for _, width in step) > 359 + 64  # a group grew past its first room


def test_a_model_switched_off_the_grouped_attention_mid_batch_goes_on_in_one_group():
    model = tiny_llama()
    use_decode_attention(model)
    prompts = [_request(n, length=length).prompt for n, length in enumerate([7, 280, 300])]
    with torch.inference_mode():
        alone = {n: _decode(_batch_of(model, [(row, states)]))[n]
                 for n, (row, states) in enumerate(_rows_of(model, prompts, budget=8))}
        batch = _batch_of(model, _rows_of(model, prompts, budget=8))
        assert len(batch.groups) == 2
        seen: list[int] = []

        def switch(step: int) -> None:
            if step == 3:
                model.set_attn_implementation("sdpa")
            seen.append(len(batch.groups))

        together = _decode(batch, switch)
    assert together == alone
    assert seen[:3] == [2, 2, 2] and seen[3] == 1  # merged at the first step after the switch


def _batch_of(model: Any, arrivals: list[tuple[Row, Any]]) -> RunningBatch:
    batch = RunningBatch(model, {END})
    batch.add(arrivals)
    return batch
