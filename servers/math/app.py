"""``math``: single-turn math problems, answers checked symbolically with math-verify.

The row's user message asks for the final answer in ``\\boxed{}``; the row's
``expected_answer`` is the reference (LaTeX or plain). No tools: the episode is one model
turn, then ``/verify``.

Reward: the answer is the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` in
the **last assistant message** (reasoning items do not count), else the ``answer_fallback``
rule (``last_number``, ``answer_colon``, or ``none``, the default). ``reward = 1.0`` when
math-verify finds it equal to ``expected_answer`` (``\\frac{1}{2}`` = ``0.5`` = ``1/2``,
``2\\sqrt{2}`` = ``\\sqrt{8}``), else 0.0. With a judge configured, answers math-verify calls
unequal go to an LLM judge, whose verdict then decides. Verification runs in a process pool
(or Ray workers, started and warmed before the first answer is checked) under
``verify_timeout_s``. A comparison that judged nothing (it timed out, its worker or node was
lost) is ``failure_kind: verify_timeout`` with ``failure_reason``: an infrastructure failure that
collection, the envs and the trainer adapters take as no reward (``protocol/failures.py``).

Metrics: ``extracted_answer``, ``library_reward``, ``judge_reward`` (``None`` unless the judge
gave a verdict), ``judge_error``, ``answer_truncated``.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from nemo_gym_env.errors import TaskTimeout
from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym_env.server.workers import ProcessPoolRunner, RayRunner, TaskRunner, default_workers
from nemo_gym_env.servers.math.answer import AnswerFallback, extract_answer, last_assistant_text
from nemo_gym_env.servers.math.equivalence import equivalent, init_worker
from nemo_gym_env.servers.math.judge import JudgeError, MathJudge

__all__ = [
    "MathResourcesServer",
    "MathResourcesServerConfig",
    "MathRunRequest",
    "MathVerifyRequest",
    "MathVerifyResponse",
]

logger = logging.getLogger("nemo_gym_env.servers.math")

HARD_LIMIT_GRACE_S = 5.0
"""Past ``verify_timeout_s`` plus this, a worker that has not stopped itself is killed."""

_METRIC_KEYS = frozenset(
    {
        "reward",
        "extracted_answer",
        "library_reward",
        "judge_reward",
        "judge_error",
        "answer_truncated",
        "failure_kind",
        "failure_reason",
    }
)


class MathResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the math server (keys of its YAML block).

    Attributes:
        answer_fallback: Where to find the answer when there is no box: ``last_number`` (the
            last number in the message), ``answer_colon`` (the rest of the line after the last
            ``Answer:``), or ``none``.
        verify_workers: Worker processes for math-verify, or with a Ray address the CPUs reserved
            on the cluster for its Ray tasks (at most that many run at once); default half the
            CPUs, 1 to 4 (:func:`~nemo_gym_env.server.workers.default_workers`).
        verify_timeout_s: Time limit of one comparison; past it the reward is 0 with
            ``failure_reason``.
        max_answer_chars: Only the last this many characters of the message are searched.
        ray_address: Run comparisons as Ray tasks on this cluster instead, in ``verify_workers``
            CPUs reserved at start (needs ``ray``).
        ray_head_node_address: NeMo Gym's name for ``ray_address``.
        judge_base_url: OpenAI-compatible endpoint of an LLM judge (off when unset).
        judge_model: Model name for the judge.
        judge_api_key: Key for the judge endpoint; never logged or echoed.
        judge_timeout_s: Per-request timeout of the judge.
        judge_max_concurrency: Judge requests in flight at once.
    """

    answer_fallback: AnswerFallback = "none"
    verify_workers: int | None = Field(default=None, ge=1)
    verify_timeout_s: float = Field(default=10.0, gt=0)
    max_answer_chars: int = Field(default=100_000, ge=1)
    ray_address: str | None = None
    ray_head_node_address: str | None = None
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key: SecretStr | None = None
    judge_timeout_s: float = Field(default=60.0, gt=0)
    judge_max_concurrency: int = Field(default=16, ge=1)

    @model_validator(mode="after")
    def _judge_needs_a_model(self) -> MathResourcesServerConfig:
        if self.judge_base_url and not self.judge_model:
            raise ValueError("judge_base_url is set but judge_model is not; set both to use the judge")
        return self


class MathRunRequest(BaseRunRequest):
    """A dataset row: the prompt, the reference answer, and optionally the problem text for the judge."""

    expected_answer: str
    question: str | None = None

    @field_validator("expected_answer")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("expected_answer is empty")
        return value


class MathVerifyRequest(MathRunRequest, BaseVerifyRequest):
    """The row plus the finished episode."""


class MathVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the metrics.

    Attributes:
        extracted_answer: The answer as found in the last assistant message (``None``: none found).
        library_reward: math-verify's verdict, 1.0 or 0.0.
        judge_reward: The judge's verdict, or ``None`` when the judge was not asked or failed.
        judge_error: Why the judge failed (the reward is then ``library_reward``).
        answer_truncated: The message was longer than ``max_answer_chars``; only its tail was searched.
    """

    extracted_answer: str | None
    library_reward: float
    judge_reward: float | None = None
    judge_error: str | None = None
    answer_truncated: bool = False


def _question(body: MathRunRequest) -> str:
    """The problem for the judge: the row's ``question``, else the last user message's text."""
    if body.question:
        return body.question
    items = body.responses_create_params.input
    if isinstance(items, str):
        return items
    for item in reversed(items):
        if getattr(item, "role", None) == "user":
            content = getattr(item, "content", "")
            if isinstance(content, str):
                return content
            return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class MathResourcesServer(SimpleResourcesServer):
    """The ``math`` resources server."""

    REVERIFY_MODE = "stateless"  # /verify reads only its body

    config: MathResourcesServerConfig = Field(default_factory=MathResourcesServerConfig)
    _runner: TaskRunner = PrivateAttr()
    _judge: MathJudge | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if importlib.util.find_spec("math_verify") is None:
            raise RuntimeError("the math server needs math-verify: pip install 'nemo-gym-env[math]'")
        config = self.config
        address = config.ray_address or config.ray_head_node_address
        if address:
            # verify_workers CPUs reserved on the cluster at start (a clear error when ray is missing)
            self._runner = RayRunner(address, slots=config.verify_workers or default_workers(),
                                     label="math verifier", initializer=init_worker)
        else:
            self._runner = ProcessPoolRunner(
                config.verify_workers or default_workers(), initializer=init_worker
            )
        if config.judge_base_url:
            self._judge = MathJudge(
                base_url=config.judge_base_url,
                model=str(config.judge_model),
                api_key=config.judge_api_key,
                timeout_s=config.judge_timeout_s,
                max_concurrency=config.judge_max_concurrency,
            )

    def setup_webserver(self) -> FastAPI:
        """Standard routes only (no tools); the workers start and stop with the app.

        Pool workers warm up in the background (the server answers at once; the first
        verification waits for them); a Ray cluster is joined before the server answers.
        """
        app = super().setup_webserver()
        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
            async with inner(app) as state:
                await self._runner.start()
                try:
                    yield state
                finally:
                    await self.aclose()

        app.router.lifespan_context = lifespan
        return app

    async def aclose(self) -> None:
        """Stop the verification workers and close the judge's connections."""
        await self._runner.aclose()
        if self._judge is not None:
            await self._judge.aclose()

    async def verify(self, body: MathVerifyRequest) -> MathVerifyResponse:
        """Extract the final answer, compare it with math-verify, ask the judge if configured."""
        config = self.config
        text, truncated = last_assistant_text(body.response.output, config.max_answer_chars)
        extracted = extract_answer(text, config.answer_fallback) if text else None
        metrics: dict[str, Any] = {
            "reward": 0.0,
            "extracted_answer": extracted,
            "library_reward": 0.0,
            "judge_reward": None,
            "answer_truncated": truncated,
        }
        if extracted is not None:
            metrics.update(await self._grade(body, extracted))
        echoed = body.model_dump(exclude=set(_METRIC_KEYS))
        return MathVerifyResponse(**echoed, **metrics)

    async def _grade(self, body: MathVerifyRequest, extracted: str) -> dict[str, Any]:
        limit = self.config.verify_timeout_s
        try:
            verdict = await self._runner.run(
                equivalent, body.expected_answer, extracted, limit, timeout_s=limit + HARD_LIMIT_GRACE_S
            )
        except TaskTimeout as exc:  # the worker overran the hard limit, or was lost (TaskLost)
            verdict, why = "timeout", str(exc)
        else:
            why = f"math-verify did not finish within verify_timeout_s={limit:g} s"
        if verdict == "timeout":  # nothing was judged: an infrastructure failure, no reward (protocol.failures)
            return {
                "failure_kind": "verify_timeout",
                "failure_reason": (
                    f"the answer ({len(extracted)} chars) was not compared with expected_answer: {why}; "
                    "no verdict (not a reward: retry it)"
                ),
            }
        library_reward = 1.0 if verdict == "equal" else 0.0
        metrics: dict[str, Any] = {"reward": library_reward, "library_reward": library_reward}
        if library_reward == 0.0 and self._judge is not None:
            try:
                same = await self._judge.equivalent(
                    _question(body), expected=body.expected_answer, answer=extracted
                )
            except JudgeError as exc:
                logger.warning("math judge failed: %s", exc)
                metrics["judge_error"] = str(exc)
            else:
                metrics["judge_reward"] = metrics["reward"] = 1.0 if same else 0.0
        return metrics


if __name__ == "__main__":
    MathResourcesServer.run_webserver()
