"""``mcqa``: single-turn multiple-choice questions, graded by the option letter the model picks.

Rows carry ``options`` (NeMo Gym's list of one-key dicts ``[{"A": "..."}, ...]``, or one
dict letter -> text) and ``expected_answer`` (a letter). No tools: the episode is one model
turn, then ``/verify``.

Reward: 1.0 when the letter read from the **last assistant message** (reasoning items do not
count) equals ``expected_answer``, else 0.0. How the letter is read is the grading mode: the
row's ``grading_mode``, else the config's, else ``strict_single_letter_boxed``:

- ``strict_single_letter_boxed``: exactly one ``\\boxed{X}``, X a single uppercase option letter;
- ``lenient_boxed``: the last box that names an option (``\\boxed{b}``, ``\\boxed{\\text{B}}``,
  ``\\boxed{B) Paris}``, or an option's exact text);
- ``lenient_answer_colon``: the last ``Answer: X`` (any case; a letter or an option's text).

A row's ``template_metadata.output_regex`` (one pattern or a list; group 1 is the letter) is
tried first, on the last 20,000 characters, in a worker process under ``regex_timeout_s``;
when it finds no valid letter the grading mode decides. Metrics: ``extracted_answer``,
``grading_mode``, ``answer_source``, ``regex_error``, ``answer_truncated``.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from nemo_gym_env.errors import TaskTimeout
from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym_env.server.workers import ProcessPoolRunner
from nemo_gym_env.servers.math.answer import last_assistant_text
from nemo_gym_env.servers.mcqa.choices import (
    answer_colon_letter,
    captured_letter,
    last_captures,
    lenient_boxed_letter,
    option_letters,
    strict_boxed_letter,
)

__all__ = [
    "GradingMode",
    "MCQAResourcesServer",
    "MCQAResourcesServerConfig",
    "MCQARunRequest",
    "MCQAVerifyRequest",
    "MCQAVerifyResponse",
    "TemplateMetadata",
]

GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]
DEFAULT_GRADING_MODE: GradingMode = "strict_single_letter_boxed"

MAX_REGEX_CHARS = 500
"""Longest ``output_regex`` pattern accepted."""
REGEX_WINDOW_CHARS = 20_000
"""An ``output_regex`` sees only this many characters at the end of the message."""

_READERS = {
    "strict_single_letter_boxed": strict_boxed_letter,
    "lenient_boxed": lenient_boxed_letter,
    "lenient_answer_colon": answer_colon_letter,
}
_METRIC_KEYS = frozenset(
    {
        "reward",
        "extracted_answer",
        "grading_mode",
        "answer_source",
        "regex_error",
        "answer_truncated",
        "failure_kind",
        "failure_reason",
    }
)


class MCQAResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the mcqa server (keys of its YAML block).

    Attributes:
        grading_mode: Mode for rows that name none (``null``: ``strict_single_letter_boxed``).
        max_answer_chars: Only the last this many characters of the message are read.
        regex_timeout_s: Time limit of one row's ``output_regex``; past it the grading mode decides.
        regex_workers: Worker processes for ``output_regex`` (started on first use).
    """

    grading_mode: GradingMode | None = None
    max_answer_chars: int = Field(default=100_000, ge=1)
    regex_timeout_s: float = Field(default=2.0, gt=0)
    regex_workers: int = Field(default=1, ge=1)


class TemplateMetadata(BaseModel):
    """``template_metadata`` of a row: ``output_regex`` is read, anything else is kept as is."""

    model_config = ConfigDict(extra="allow")

    output_regex: str | list[str] | None = None

    @field_validator("output_regex")
    @classmethod
    def _safe_patterns(cls, value: str | list[str] | None) -> str | list[str] | None:
        for pattern in [value] if isinstance(value, str) else value or []:
            if len(pattern) > MAX_REGEX_CHARS:
                raise ValueError(f"output_regex pattern is {len(pattern)} chars; at most {MAX_REGEX_CHARS}")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"output_regex {pattern!r} is not a valid regex: {exc}") from None
        return value

    def patterns(self) -> list[str]:
        """The patterns, in the order they are tried."""
        value = self.output_regex
        return [value] if isinstance(value, str) else list(value or [])


class MCQARunRequest(BaseRunRequest):
    """A dataset row: the prompt, the options, the expected letter, optionally a grading mode and regex."""

    options: list[dict[str, str | None]] | dict[str, str | None]
    expected_answer: str
    grading_mode: GradingMode | None = None
    template_metadata: TemplateMetadata | None = None

    @model_validator(mode="after")
    def _expected_is_an_option(self) -> MCQARunRequest:
        letters = option_letters(self.options)  # raises ValueError on a bad key
        if not letters:
            raise ValueError("options holds no option")
        expected = self.expected_answer.strip().upper()
        if expected not in letters:
            raise ValueError(
                f"expected_answer {self.expected_answer!r} is not one of the options {sorted(letters)}"
            )
        return self

    def letters(self) -> dict[str, str]:
        """The options as uppercase letter -> text."""
        return option_letters(self.options)


class MCQAVerifyRequest(MCQARunRequest, BaseVerifyRequest):
    """The row plus the finished episode."""


class MCQAVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the metrics.

    Attributes:
        extracted_answer: The letter read from the answer (``None``: none found).
        grading_mode: The mode that applied (the row's, else the config's, else the default).
        answer_source: ``"output_regex"`` or ``"grading_mode"``: what found the letter.
        regex_error: Why the row's ``output_regex`` could not be applied (it timed out).
        answer_truncated: The message was longer than ``max_answer_chars``; only its tail was read.
    """

    extracted_answer: str | None
    grading_mode: GradingMode
    answer_source: Literal["output_regex", "grading_mode"] | None = None
    regex_error: str | None = None
    answer_truncated: bool = False


class MCQAResourcesServer(SimpleResourcesServer):
    """The ``mcqa`` resources server."""

    REVERIFY_MODE = "stateless"  # /verify reads only its body

    config: MCQAResourcesServerConfig = Field(default_factory=MCQAResourcesServerConfig)
    _runner: ProcessPoolRunner = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._runner = ProcessPoolRunner(self.config.regex_workers)

    async def aclose(self) -> None:
        """Stop the ``output_regex`` workers, if any were started."""
        await self._runner.aclose()

    def setup_webserver(self) -> FastAPI:
        """Standard routes only (no tools); ``output_regex`` workers stop with the app."""
        app = super().setup_webserver()
        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
            async with inner(app) as state:
                try:
                    yield state
                finally:
                    await self.aclose()

        app.router.lifespan_context = lifespan
        return app

    async def verify(self, body: MCQAVerifyRequest) -> MCQAVerifyResponse:
        """Read the chosen letter (row regex first, then the grading mode) and compare it."""
        mode: GradingMode = body.grading_mode or self.config.grading_mode or DEFAULT_GRADING_MODE
        options = body.letters()
        text, truncated = last_assistant_text(body.response.output, self.config.max_answer_chars)
        metrics: dict[str, Any] = {"grading_mode": mode, "answer_truncated": truncated}
        letter, source = None, None
        if text:
            patterns = body.template_metadata.patterns() if body.template_metadata else []
            if patterns:
                letter, metrics["regex_error"] = await self._regex_letter(patterns, text, options)
                source = "output_regex" if letter else None
            if letter is None:
                letter = _READERS[mode](text, options)
                source = "grading_mode" if letter else None
        expected = body.expected_answer.strip().upper()
        metrics.update(
            reward=1.0 if letter == expected else 0.0, extracted_answer=letter, answer_source=source
        )
        return MCQAVerifyResponse(**body.model_dump(exclude=set(_METRIC_KEYS)), **metrics)

    async def _regex_letter(
        self, patterns: list[str], text: str, options: dict[str, str]
    ) -> tuple[str | None, str | None]:
        """The first pattern's letter that names an option, run in a worker; ``(letter, error)``."""
        window = text[-REGEX_WINDOW_CHARS:]
        limit = self.config.regex_timeout_s
        try:
            captures = await self._runner.run(last_captures, patterns, window, timeout_s=limit)
        except TaskTimeout:
            return None, f"output_regex did not finish within regex_timeout_s={limit:g} s; grading_mode used"
        for capture in captures:
            letter = captured_letter(capture, options) if capture is not None else None
            if letter is not None:
                return letter, None
        return None, None


if __name__ == "__main__":
    MCQAResourcesServer.run_webserver()
