"""One model, many concurrent turns: a worker thread that decodes them together.

:class:`BatchGenerator` owns a causal LM. :meth:`~BatchGenerator.generate` queues one prompt
and awaits its result. A single worker thread runs a continuous batch
(:class:`~nemo_gym_env.policies.decoding.RunningBatch`):

1. a queued turn is prefilled on its own (all of its prompt but the last token), from the
   longest prefix whose key/value states are cached (:mod:`~nemo_gym_env.policies.kv_cache`):
   the previous turn of its episode, or another rollout of its task, so a turn computes only
   what is new, and no padding is ever computed;
2. it joins the running batch at the next step; every step decodes one token for every row in
   one forward pass, each row with its own temperature, top-p, seed and token budget
   (:mod:`~nemo_gym_env.policies.sampling`);
3. a row that produced an end-of-turn token (kept) or its whole budget leaves at once: its
   caller gets exactly its own generated ids and their log-probabilities, its states go to the
   prefix cache, and its slot takes the next queued turn.

When the batch is idle, the first turn waits for others while they keep coming (``wait_s``
apart, or while a caller is still building its prompt; at most ``_MAX_GATHER_S``), so that
concurrent episodes start together. Models whose cache is not a plain dynamic cache (sliding
windows, linear attention) are generated as fixed batches instead (:mod:`~nemo_gym_env.policies.fixed_batch`).

Why batches: one sequence at a time, a small model on a CPU spends each decoding step on
per-step overhead and memory traffic, not arithmetic; 8 or 16 rows cost little more per step
than one (``benchmarks/README.md``, "The local policy").

Reproducibility: greedy rows (temperature 0) give the tokens they give alone for the prompts
the tests check; the logits of a batch differ from a lone row's by float rounding (about 1e-5:
the matrix kernels sum in a different order for a different number of rows, padding or not),
so a near-tie between two tokens could in principle resolve differently. A sampled row draws
its noise from its own generator, seeded per call, so the same seeds give the same tokens
however calls are grouped into batches (within the same rounding caveat).

Failures: a model that raises fails the turns of the step it raised in (every row then in the
batch, or the one turn whose prefill raised), each with a
:class:`~nemo_gym_env.errors.PolicyError` naming the cause; the next turns run as usual. Every
wait is bounded: the worker polls its queue with a timeout; a caller whose worker thread has
died gets a ``PolicyError`` within a second instead of waiting forever; a caller that goes away
(cancelled, timed out) has its row dropped at the next step, or skipped if it has not started;
:meth:`~BatchGenerator.close` (also run at interpreter exit) stops the batch at its next step.

Threads: the worker sets torch's intra-op threads to ``num_threads`` (default: the CPUs this
process may run on, unless ``OMP_NUM_THREADS`` is set). A decoding step is hundreds of small
parallel regions; between two of them OpenMP's threads either spin or sleep. Importing this
module before torch sets ``GOMP_SPINCOUNT=10000`` (a few microseconds of spinning, then sleep)
unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set: on an otherwise idle machine one
conversation decodes about 1.8x faster than with ``OMP_WAIT_POLICY=PASSIVE`` (no spinning),
which is the better choice where other processes keep every core busy (there it is about 1.7x
faster than spinning); ``benchmarks/README.md``, "Threads and waiting", has the figures.

Example::

    generator = BatchGenerator(model, end_ids={2}, pad_id=2, max_batch_size=16)
    result = await generator.generate(GenerationRequest(prompt=ids, temperature=0.0, top_p=1.0,
                                                        max_new_tokens=64, seed=0))
    result.token_ids, result.log_probs
    generator.close()
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# OpenMP reads how its threads wait once, when torch loads it: it has to be set before that import.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"

import torch  # noqa: E402

from nemo_gym_env.errors import PolicyError  # noqa: E402
from nemo_gym_env.policies.attention import use_decode_attention  # noqa: E402
from nemo_gym_env.policies.decoding import Row, RunningBatch  # noqa: E402
from nemo_gym_env.policies.fixed_batch import generate_fixed  # noqa: E402
from nemo_gym_env.policies.kv_cache import PrefixCache, cache_keyword, prefill, supports_prefill  # noqa: E402
from nemo_gym_env.policies.sampling import row_generator  # noqa: E402
from nemo_gym_env.system.memory import trim  # noqa: E402

__all__ = ["BatchGenerator", "BatchStats", "Generation", "GenerationRequest", "available_cpus"]

log = logging.getLogger(__name__)

_POLL_S = 0.5  # how often idle waits wake up to check that their other side is still there
# How often the worker hands the C heap's free pages back (system.memory.trim): decoding frees
# tensors of many sizes, which glibc keeps; once a second took the main job's peak RSS from 2.2
# to 1.9 GB in bfloat16 (benchmarks/README.md, "The main job").
_TRIM_S = 1.0
_MAX_GATHER_S = 1.0  # the longest an idle batch waits for more turns before it starts


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass
class GenerationRequest:
    """One row of a batch: a prompt and how to continue it."""

    prompt: list[int]
    temperature: float
    """0 is greedy."""
    top_p: float
    max_new_tokens: int
    seed: int | None = None
    """Seeds this row's sampling noise (unused when greedy); None draws one from torch's global generator."""


@dataclass
class Generation:
    """What one row produced."""

    token_ids: list[int]
    log_probs: list[float]
    batch_size: int
    """How many rows were decoded with it at its last step."""
    seconds: float
    """From its prefill to its last token."""


@dataclass
class BatchStats:
    """Counters over everything generated so far (read them; the worker updates them)."""

    steps: int = 0  # decoding forward passes: each row's newest token and its drafts (``generate`` calls for fixed batches)
    rows: int = 0  # turns started
    row_steps: int = 0  # rows summed over steps: / steps is the mean batch
    failed_steps: int = 0
    prompt_tokens: int = 0
    computed_prompt_tokens: int = 0  # prompt positions computed: padding included, cached prefixes not
    cached_prompt_tokens: int = 0  # prompt tokens whose states came from the prefix cache
    generated_tokens: int = 0  # tokens returned to callers
    drafted_tokens: int = 0  # draft tokens fed with greedy rows' newest tokens
    accepted_drafts: int = 0  # draft tokens kept: tokens decoded without a step of their own
    prefill_seconds: float = 0.0  # time prefilling prompts
    step_seconds: float = 0.0  # time in decoding steps (fixed batches: in generate)
    batch_sizes: Counter = field(default_factory=Counter)  # steps by the number of rows they decoded

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain JSON values."""
        return {"steps": self.steps, "rows": self.rows, "row_steps": self.row_steps,
                "mean_batch": round(self.row_steps / self.steps, 2) if self.steps else 0.0,
                "failed_steps": self.failed_steps, "prompt_tokens": self.prompt_tokens,
                "computed_prompt_tokens": self.computed_prompt_tokens,
                "cached_prompt_tokens": self.cached_prompt_tokens, "generated_tokens": self.generated_tokens,
                "drafted_tokens": self.drafted_tokens, "accepted_drafts": self.accepted_drafts,
                "prefill_seconds": round(self.prefill_seconds, 3), "step_seconds": round(self.step_seconds, 3),
                "batch_sizes": dict(sorted(self.batch_sizes.items()))}


@dataclass(eq=False)
class _Job:
    request: GenerationRequest
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    abandoned: bool = False
    """Its caller has gone (cancelled or timed out): stop its row, drop its result."""
    started: float = 0.0


_STOP = object()
_LIVE: weakref.WeakSet = weakref.WeakSet()  # generators whose worker may be running, closed at exit


class BatchGenerator:
    """Runs a causal LM's generations together on one worker thread (see the module docstring).

    Args:
        model: A transformers causal LM (on its device, in eval mode).
        end_ids: Token ids that end a turn; a row stops at the first one (which it keeps).
        pad_id: The id used to left-pad prompts (masked out).
        max_batch_size: Rows decoded together.
        wait_s: A batch starts once no request has arrived for this long (and none is being
            prepared), at most ``_MAX_GATHER_S`` after its first.
        preparing: How many callers are building a prompt they will submit shortly (the batch
            waits for them); None: none are announced.
        num_threads: torch intra-op threads for the worker; None: :func:`available_cpus`, unless
            ``OMP_NUM_THREADS`` is set (then torch's own setting stands).
        prefix_cache_mb: Memory for the key/value states of finished turns, reused by prompts
            that extend them; 0 keeps none.
        draft_tokens: Draft tokens a greedy turn is fed with its newest token in a decoding step, taken from its own
            context (:mod:`~nemo_gym_env.policies.drafts`); 0 decodes one token a step.
        name: Names the model in errors and logs.
    """

    def __init__(self, model: Any, *, end_ids: set[int], pad_id: int, max_batch_size: int = 16, wait_s: float = 0.05,
                 preparing: Callable[[], int] | None = None, num_threads: int | None = None,
                 prefix_cache_mb: float = 1024, draft_tokens: int = 0, name: str = "local model"):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if wait_s < 0:
            raise ValueError(f"wait_s must be >= 0, got {wait_s}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0, got {draft_tokens}")
        if not end_ids:
            raise ValueError("end_ids is empty: a row could never end before its budget")
        self.model = model
        self.end_ids = frozenset(int(i) for i in end_ids)
        self.pad_id = int(pad_id)
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._preparing = preparing or (lambda: 0)
        if num_threads is None and "OMP_NUM_THREADS" not in os.environ:
            num_threads = available_cpus()
        self.num_threads = num_threads if num_threads is not None else torch.get_num_threads()
        self.name = name
        self.stats = BatchStats()
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * (1 << 20)))
        self._keyword = cache_keyword(model) if supports_prefill(model) else ""
        self._running = RunningBatch(model, self.end_ids, drafts=draft_tokens) if self._keyword else None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._resized = False  # rows joined or left the running batch since the heap was last trimmed
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def model(self) -> Any:
        """The causal LM (replacing it takes effect at the next step)."""
        return self._model

    @model.setter
    def model(self, model: Any) -> None:
        use_decode_attention(model)  # a decoding step's attention without SDPA's slow one-token CPU path
        self._model = model
        if getattr(self, "_running", None) is not None:
            self._running.model = model

    def __repr__(self) -> str:
        return f"BatchGenerator(name={self.name!r}, max_batch_size={self.max_batch_size}, threads={self.num_threads})"

    # ---- the callers' side -------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Queue ``request``; the future resolves to its :class:`Generation` (or a ``PolicyError``)."""
        return self._submit(request).future

    def _submit(self, request: GenerationRequest) -> _Job:
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if not request.prompt:
            raise ValueError("the prompt is empty")
        job = _Job(request)
        with self._start_lock:
            if self._closed:
                raise PolicyError(f"{self.name}: closed; no more generations")
            if self._thread is None or not self._thread.is_alive():
                if self._thread is not None:
                    log.warning("%s: the generation worker had stopped; starting a new one", self.name)
                self._thread = threading.Thread(
                    target=_serve, args=(weakref.ref(self), self._queue), name=f"{self.name} batches", daemon=True)
                self._thread.start()
                _LIVE.add(self)
            self._queue.put(job)
        return job

    async def generate(self, request: GenerationRequest) -> Generation:
        """Queue ``request`` and wait for its row of a batch.

        Raises:
            PolicyError: The model failed on this request's batch, the worker stopped, or the
                generator was closed.
        """
        job = self._submit(request)
        future = asyncio.wrap_future(job.future)
        try:
            while True:
                done, _ = await asyncio.wait({future}, timeout=_POLL_S)
                if done:
                    return future.result()
                thread = self._thread
                if thread is None or not thread.is_alive():
                    raise PolicyError(f"{self.name}: the generation worker stopped before answering")
        except asyncio.CancelledError:
            job.abandoned = True  # running: its row stops at the next step
            future.cancel()  # not started yet: the worker skips it
            raise

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker: a running batch stops at its next step (its unfinished rows raise ``PolicyError``),
        queued and later requests raise ``PolicyError``."""
        with self._start_lock:
            self._closed = True
            thread = self._thread
            self._queue.put(_STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("%s: the generation worker did not stop within %.0f s", self.name, timeout_s)

    # ---- the worker's side -------------------------------------------------------------------

    def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """``first`` plus what follows it closely (up to ``max_batch_size``); and whether to stop.

        Gathering ends once nothing has arrived for ``wait_s`` and no caller is still building a
        prompt (``preparing``), or after ``_MAX_GATHER_S``: concurrent episodes come back from
        their tool calls a few milliseconds apart, and starting them together fills the batch.
        """
        jobs, stop = [first], False
        started = time.monotonic()
        cap = started + max(_MAX_GATHER_S, self.wait_s)
        deadline = min(cap, started + self.wait_s)
        while len(jobs) < self.max_batch_size:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                now = time.monotonic()
                if now >= deadline:
                    if now < cap and self._preparing() > 0:
                        deadline = min(cap, now + self.wait_s)
                        continue
                    break
                try:
                    item = self._queue.get(timeout=deadline - now)
                except queue.Empty:
                    continue
            if item is _STOP:
                stop = True
                break
            jobs.append(item)
            deadline = min(cap, time.monotonic() + self.wait_s)
        return [j for j in jobs if j.future.set_running_or_notify_cancel()], stop

    def _drain(self, room: int) -> tuple[list[_Job], bool]:
        """Up to ``room`` queued jobs, without waiting; and whether to stop."""
        jobs: list[_Job] = []
        while len(jobs) < room:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return [j for j in jobs if j.future.set_running_or_notify_cancel()], True
            jobs.append(item)
        return [j for j in jobs if j.future.set_running_or_notify_cancel()], False

    def _busy(self) -> bool:
        return self._running is not None and bool(self._running.rows)

    def _work(self, jobs: list[_Job]) -> None:
        """Start ``jobs`` and decode one step (a fixed batch, for models without a running batch)."""
        for job in jobs:
            self.stats.rows += 1
            self.stats.prompt_tokens += len(job.request.prompt)
        if self._running is None:
            if jobs:
                self._run_fixed(jobs)
            return
        self._admit(jobs)
        if self._running.rows:
            self._step()

    def _admit(self, jobs: list[_Job]) -> None:
        """Prefill each job's prompt (a failure fails that job only) and let them join the running batch."""
        arrivals, prompts_kept = [], []
        for job in jobs:
            request = job.request
            head = request.prompt[:-1]
            started = time.perf_counter()
            try:
                count, cached = self.prefix_cache.longest(head)
                states = prefill(self.model, head, cached, self._keyword)
            except Exception as exc:  # noqa: BLE001 - a failing model fails this turn, never the worker
                self._fail([job], exc, "prefilling a turn")
                continue
            finally:
                self.stats.prefill_seconds += time.perf_counter() - started
            if self.prefix_cache.max_bytes and len(head) > count:
                prompts_kept.append(self.prefix_cache.put(head, states))  # the next arrival of this prompt starts here
            self.stats.cached_prompt_tokens += count
            self.stats.computed_prompt_tokens += len(request.prompt) - count
            job.started = time.perf_counter()
            row = Row(key=job, prompt=list(request.prompt), temperature=request.temperature, top_p=request.top_p,
                      budget=request.max_new_tokens, generator=row_generator(_seed(request)))
            arrivals.append((row, states))
        self._running.add(arrivals)
        self._resized = self._resized or bool(arrivals)
        # The batch holds these prompts' states now and the cache gets them back, extended, when their
        # turns end: kept on past this admission they would be a second copy of the running batch.
        for key in prompts_kept:
            self.prefix_cache.discard(key)

    def _step(self) -> None:
        running = self._running
        rows = len(running.rows)
        started = time.perf_counter()
        try:
            running.step()
        except Exception as exc:  # noqa: BLE001 - a failing model fails this step's turns, never the worker
            jobs = [row.key for row in running.rows]
            running.clear()
            self._fail(jobs, exc, f"a batch of {rows} turn(s)")
            return
        finally:
            self.stats.step_seconds += time.perf_counter() - started
        self.stats.steps += 1
        self.stats.row_steps += rows
        self.stats.batch_sizes[rows] += 1
        self.stats.drafted_tokens, self.stats.accepted_drafts = running.drafted, running.accepted
        finished = [row for row in running.rows if running.ended(row)]
        states = {id(row): running.states(row) for row in finished
                  if self.prefix_cache.max_bytes and not row.key.abandoned}
        for row in running.pop_finished(halted=lambda row: row.key.abandoned or self._closed):
            self._resized = True
            job = row.key
            if row.halted:
                job.future.set_exception(PolicyError(f"{self.name}: stopped before this turn was finished "
                                                     "(the policy was closed, or the turn was cancelled)"))
                continue
            if id(row) in states:
                self.prefix_cache.put(row.prompt + row.tokens[:-1], states[id(row)])
            self.stats.generated_tokens += len(row.tokens)
            job.future.set_result(Generation(row.tokens, row.log_probs, rows, time.perf_counter() - job.started))

    def _run_fixed(self, jobs: list[_Job]) -> None:
        started = time.perf_counter()
        rows = [(j.request.prompt, j.request.temperature, j.request.top_p, j.request.max_new_tokens,
                 row_generator(_seed(j.request))) for j in jobs]
        try:
            results = generate_fixed(self.model, rows, end_ids=self.end_ids, pad_id=self.pad_id,
                                     halted=lambda: [j.abandoned or self._closed for j in jobs])
        except Exception as exc:  # noqa: BLE001 - a failing model fails this batch, never the worker
            self._fail(jobs, exc, f"a batch of {len(jobs)} turn(s)")
            return
        finally:
            self.stats.step_seconds += time.perf_counter() - started
        self.stats.steps += 1
        self.stats.row_steps += len(jobs)
        self.stats.batch_sizes[len(jobs)] += 1
        self.stats.computed_prompt_tokens += len(jobs) * max(len(j.request.prompt) for j in jobs)
        elapsed = time.perf_counter() - started
        for job, (tokens, log_probs) in zip(jobs, results):
            if tokens and (tokens[-1] in self.end_ids or len(tokens) >= job.request.max_new_tokens):
                self.stats.generated_tokens += len(tokens)
                job.future.set_result(Generation(tokens, log_probs, len(jobs), elapsed))
            else:
                job.future.set_exception(PolicyError(f"{self.name}: stopped before this turn was finished "
                                                     "(the policy was closed, or the turn was cancelled)"))

    def _fail(self, jobs: list[_Job], exc: Exception, what: str) -> None:
        self.stats.failed_steps += 1
        error = PolicyError(f"{self.name} failed on {what}: {type(exc).__name__}: {exc}")
        log.warning("%s", error)
        for job in jobs:
            job.future.set_exception(error)

    def _stop_all(self) -> None:
        """Fail every turn still in the batch (the generator is closing)."""
        if self._running is not None and self._running.rows:
            jobs = [row.key for row in self._running.rows]
            self._running.clear()
            for job in jobs:
                job.future.set_exception(PolicyError(f"{self.name}: closed before this turn was finished"))


def _seed(request: GenerationRequest) -> int:
    if request.seed is not None:
        return request.seed
    return int(torch.randint(0, 1 << 62, (1,)).item())


def _serve(owner_ref: weakref.ref, jobs: queue.SimpleQueue) -> None:
    """The worker thread: decodes until told to stop, or until its generator is garbage-collected.

    While the batch is idle it holds no reference to its generator (and so to the model), so a
    policy dropped without ``close`` is still freed; the thread then ends within ``_POLL_S``.
    """
    name = "local model"
    trimmed = time.monotonic()
    owner = owner_ref()
    if owner is not None:
        torch.set_num_threads(owner.num_threads)  # per thread: OpenMP keeps the count per calling thread
        name = owner.name
    try:
        while True:
            if owner is None or not owner._busy():
                owner = None
                try:
                    first = jobs.get(timeout=_POLL_S)
                except queue.Empty:
                    if owner_ref() is None:
                        return
                    continue
                if first is _STOP:
                    return
                owner = owner_ref()
                if owner is None:
                    first.future.set_exception(PolicyError(f"{name}: the policy was garbage-collected"))
                    return
                batch, stop = owner._gather(first)
            else:
                batch, stop = owner._drain(owner.max_batch_size - len(owner._running.rows))
            if stop:
                for job in batch:
                    job.future.set_exception(PolicyError(f"{name}: closed before this turn was generated"))
                owner._stop_all()
                return
            with torch.inference_mode():  # no autograd graph: prefill's activations would stay alive
                owner._work(batch)
            del batch
            if owner._resized or time.monotonic() - trimmed > _TRIM_S:
                trim()
                trimmed = time.monotonic()
                owner._resized = False
    finally:
        if owner is not None:
            owner._stop_all()
        _fail_queued(jobs, name)


def _fail_queued(jobs: queue.SimpleQueue, name: str) -> None:
    while True:
        try:
            job = jobs.get_nowait()
        except queue.Empty:
            return
        if job is not _STOP and job.future.set_running_or_notify_cancel():
            job.future.set_exception(PolicyError(f"{name}: closed before this turn was generated"))


@atexit.register
def _close_all_at_exit() -> None:
    """A worker still inside the model when the interpreter exits would abort it: stop them first."""
    for generator in list(_LIVE):
        generator.close(timeout_s=5.0)
