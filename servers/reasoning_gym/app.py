"""``reasoning_gym``: procedurally generated reasoning tasks, scored by the reasoning-gym library.

A row names a reasoning-gym entry (``task_name``, ``task_seed``, ``task_size``,
``task_index``, ``task_config``) and holds the ``question`` the model was shown, never the
answer; NeMo Gym's rows, which carry the entry (``answer``, ``metadata.source_dataset``), are
accepted too and scored against it as written. ``/verify`` rebuilds the entry with the library, takes the model's answer from the
last assistant message, and returns the library's own ``score_answer`` as the reward.

Answer: the content of the last ``<answer>...</answer>`` in the last assistant message;
without one, per config ``answer_fallback``: ``"none"``; ``"boxed"`` (default), the last
``\\boxed{...}``; ``"full_text"``, the last ``\\boxed{...}`` or else the whole stripped text.
Reasoning items and tool outputs are never read.

Reward: the raw library score (usually 0 or 1; some tasks give partial credit). 0.0 with
``failure_kind``/``failure_reason`` when the entry cannot be rebuilt (``unknown_task``,
``invalid_task_config``, ``task_mismatch``: the rebuilt question differs from the row's),
the scorer raises (``scorer_error``) or runs past ``score_timeout_s`` (``score_timeout``), or
the answer is longer than ``max_answer_chars`` (``answer_too_long``, not scored). Metrics:
``task_name``, ``score``, ``extracted_answer``, ``answer_source``.

Scoring runs in a pool of worker processes (some scorers are CPU-heavy, a few can be made
to run forever), so the event loop, and every other route, stays responsive; a worker past
its timeout is killed and replaced.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import Field, StrictInt, model_validator

from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym_env.server.workers import default_workers
from nemo_gym_env.servers.reasoning_gym import tasks
from nemo_gym_env.servers.reasoning_gym.answers import (
    AnswerFallback,
    AnswerSource,
    extract_answer,
    final_text,
)
from nemo_gym_env.servers.reasoning_gym.pool import (
    PoolClosed,
    WorkerCrashed,
    WorkerError,
    WorkerPool,
    WorkerTimeout,
)

__all__ = [
    "ReasoningGymResourcesServer",
    "ReasoningGymResourcesServerConfig",
    "ReasoningGymRunRequest",
    "ReasoningGymVerifyRequest",
    "ReasoningGymVerifyResponse",
]


class ReasoningGymResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the reasoning_gym server.

    Attributes:
        answer_fallback: Where to look when the last assistant message has no ``<answer>``
            tag: ``"none"``, ``"boxed"`` (the last ``\\boxed{}``) or ``"full_text"``
            (``\\boxed{}``, then the whole stripped message).
        score_timeout_s: Time allowed to rebuild and score one answer; past it the reward is
            0 (``failure_kind="score_timeout"``) and the worker is replaced.
        scoring_workers: Scoring processes (default: half the CPUs, 1 to 4,
            :func:`~nemo_gym_env.server.workers.default_workers`).
        scoring_memory_mb: Address-space limit of each scoring process; ``null`` for none.
        max_answer_chars: Longer extracted answers are not scored (reward 0, ``answer_too_long``).
    """

    answer_fallback: AnswerFallback = "boxed"
    score_timeout_s: float = Field(default=10.0, gt=0)
    scoring_workers: int | None = Field(default=None, ge=1)
    scoring_memory_mb: int | None = Field(default=4096, ge=256)
    max_answer_chars: int = Field(default=20_000, ge=1)


class ReasoningGymRunRequest(BaseRunRequest):
    """A dataset row: the prompt plus the reasoning-gym entry it was generated from.

    Two forms are accepted. Ours names the entry (``task_name``, ``task_seed``, ``task_size``,
    ``task_index``, ``task_config``) and the server rebuilds it. NeMo Gym's carries the entry
    (``answer``, which may be null, and ``metadata`` with ``metadata["source_dataset"]``, the task
    name) and the server scores against it as written. A row with both is scored from its
    ``task_*`` fields.
    """

    question: str
    task_name: str | None = Field(default=None, min_length=1, max_length=200)
    task_seed: StrictInt | None = None
    task_size: StrictInt | None = Field(default=None, ge=1)
    task_index: StrictInt | None = Field(default=None, ge=0)
    task_config: dict[str, Any] = Field(default_factory=dict)
    answer: str | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _index_in_dataset(self) -> ReasoningGymRunRequest:
        named = [self.task_name, self.task_seed, self.task_size, self.task_index]
        if all(value is None for value in named):
            source = (self.metadata or {}).get("source_dataset")
            if not isinstance(source, str) or not source or len(source) > 200:
                raise ValueError(
                    "the row names no reasoning-gym entry: give task_name, task_seed, task_size and task_index, "
                    "or NeMo Gym's answer and metadata.source_dataset"
                )
            return self
        if any(value is None for value in named):
            missing = [n for n, v in zip(_TASK_FIELDS, named) if v is None]
            raise ValueError(f"task_name, task_seed, task_size and task_index go together; missing {missing}")
        if self.task_index >= self.task_size:
            raise ValueError(
                f"task_index {self.task_index} is outside a dataset of task_size {self.task_size}"
            )
        tasks.canonical_config(self.task_config)  # ValueError on seed/size keys or non-JSON values
        return self

    @property
    def carried(self) -> bool:
        """Whether the row carries its entry (NeMo Gym's form) rather than naming it."""
        return self.task_name is None

    @property
    def task(self) -> str:
        """The reasoning-gym task's name, in either form."""
        return self.task_name if self.task_name is not None else str((self.metadata or {})["source_dataset"])


class ReasoningGymVerifyRequest(ReasoningGymRunRequest, BaseVerifyRequest):
    """The row plus the finished episode."""


class ReasoningGymVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the metrics.

    Attributes:
        task_name: The row's reasoning-gym task.
        score: The library's raw score (0.0 when not scored).
        extracted_answer: The answer as scored (None when none was found).
        answer_source: ``answer_tag``, ``boxed``, ``full_text`` or None.
    """

    task_name: str
    score: float
    extracted_answer: str | None
    answer_source: AnswerSource | None


class ReasoningGymResourcesServer(SimpleResourcesServer):
    """The ``reasoning_gym`` resources server (no tools: one answer per episode)."""

    REVERIFY_MODE = "stateless"  # /verify reads only its body

    config: ReasoningGymResourcesServerConfig = Field(default_factory=ReasoningGymResourcesServerConfig)
    _pool: WorkerPool | None = None

    def setup_webserver(self) -> FastAPI:
        """Standard routes; the scoring pool starts with the app and stops with it."""
        app = super().setup_webserver()
        app.router.on_startup.append(self._start_pool)
        app.router.on_shutdown.append(self.close)
        return app

    def scoring_pool(self) -> WorkerPool:
        """The scoring processes (started on first use if the app's startup did not)."""
        if self._pool is None or self._pool.closed:
            workers = self.config.scoring_workers or default_workers()
            self._pool = WorkerPool(
                workers, preload=tasks.WORKER_PRELOAD, memory_mb=self.config.scoring_memory_mb
            )
        return self._pool

    def close(self) -> None:
        """Stop the scoring processes."""
        if self._pool is not None:
            self._pool.close()

    async def verify(self, body: ReasoningGymVerifyRequest) -> ReasoningGymVerifyResponse:
        """Rebuild the entry, extract the answer, score it with the library."""
        answer, source = extract_answer(final_text(body.response.output), self.config.answer_fallback)
        metrics: dict[str, Any] = {
            "task_name": body.task,
            "score": 0.0,
            "extracted_answer": answer,
            "answer_source": source,
        }
        if answer is not None and len(answer) > self.config.max_answer_chars:
            metrics["extracted_answer"] = answer[: self.config.max_answer_chars]
            outcome = _failure(
                "answer_too_long",
                f"the answer has {len(answer)} characters, over max_answer_chars={self.config.max_answer_chars}; "
                "not scored (extracted_answer shows its start)",
            )
        else:
            outcome = await self._score(body, answer)
        metrics.update(outcome)
        metrics["reward"] = metrics["score"]
        echoed = body.model_dump()
        for stale in ("failure_kind", "failure_reason"):  # a re-verified rollout row may carry old ones
            echoed.pop(stale, None)
        return ReasoningGymVerifyResponse(**{**echoed, **metrics})

    async def _score(self, body: ReasoningGymVerifyRequest, answer: str | None) -> dict[str, Any]:
        timeout = self.config.score_timeout_s
        try:
            if body.carried:
                item = {"question": body.question, "answer": body.answer, "metadata": body.metadata}
                return await self.scoring_pool().acall(tasks.score_entry, body.task, answer, item, timeout=timeout)
            key = tasks.TaskKey.from_row(body.model_dump(include=set(_TASK_FIELDS)))
            return await self.scoring_pool().acall(tasks.score, key, answer, body.question, timeout=timeout)
        except WorkerTimeout:
            return _failure(
                "score_timeout", f"rebuilding and scoring {body.task!r} took over {timeout:g} s"
            )
        except (WorkerError, WorkerCrashed, PoolClosed) as exc:
            return _failure("scorer_error", f"scoring {body.task!r} failed: {type(exc).__name__}: {exc}")

    def _start_pool(self) -> None:
        self.scoring_pool()


_TASK_FIELDS = ("task_name", "task_seed", "task_size", "task_index", "task_config")


def _failure(kind: str, reason: str) -> dict[str, Any]:
    return {"score": 0.0, "failure_kind": kind, "failure_reason": reason}


if __name__ == "__main__":
    ReasoningGymResourcesServer.run_webserver()
