"""``badge_lookup``: look people's badge numbers up with a tool, then answer exactly.

A task family for measuring whether training generalizes: its rows come from a seed
(:mod:`~nemo_gym_env.servers.badge_lookup.make_dataset`), in two kinds:

- ``single``: "What is the badge number of Ada Moreau?" The answer is the number.
- ``larger``: "Who has the larger badge number, Ada Moreau or Ben Okafor?" The answer is the name.

Tools:
    ``POST /lookup_badge`` ``{"name": str}`` -> ``{"name": ..., "badge": int}``: a number from
    100 to 999 fixed by the name (:func:`badge_number`; case and spacing do not matter), so
    the tool needs no state and a name's number cannot be guessed from the prompt.

    ``POST /submit_answer`` ``{"answer": str}`` -> ``{"answer": ..., "recorded": true}``: the
    final answer as a tool call, for trainers that hand the verifier the tool calls only (TRL's
    ``environment_factory``). Rows offer it when made with ``make_dataset(answer_tool=True)``.

Reward: 1.0 when the final answer equals the row's ``expected_answer`` (case and spacing
ignored) and the episode called ``lookup_badge`` for every name the question asks about; else
0.0. The final answer is the last ``submit_answer`` call's, when the episode made one, else the
content of the last ``\\boxed{...}`` in the episode's last assistant message. The lookups are
required so that guessing (one name of two) does not pay. Metrics: ``answer`` (what was read,
or null), ``answered``, ``correct_answer``, ``looked_up`` (share of the question's names looked
up) and ``num_tool_calls``. A trainer that wants partial credit shapes its own reward from
``looked_up`` (the TRL recipe's ``shaping``); the environment's reward stays the strict one.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)

__all__ = [
    "BadgeLookupConfig",
    "BadgeLookupServer",
    "BadgeLookupVerifyRequest",
    "BadgeLookupVerifyResponse",
    "LookupBadgeRequest",
    "LookupBadgeResponse",
    "SubmitAnswerRequest",
    "SubmitAnswerResponse",
    "badge_number",
    "episode_answer",
    "final_answer",
    "normalize",
]

TOOL_NAME = "lookup_badge"
ANSWER_TOOL_NAME = "submit_answer"
MAX_NAME_CHARS = 200
"""Longest name the tool takes (a person's name, not a document)."""
MAX_ANSWER_CHARS = 200
"""Longest answer ``submit_answer`` takes (a number or a name)."""

_BOXED = re.compile(r"\\boxed\{([^{}]{0,200})\}")
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Case and spacing folded: ``"  Ada   MOREAU "`` -> ``"ada moreau"``."""
    return _SPACES.sub(" ", text).strip().casefold()


def badge_number(name: str) -> int:
    """The badge number of ``name``: 100 to 999, fixed by the normalized name.

    Example:
        >>> badge_number("Ada Moreau") == badge_number(" ada  moreau") and 100 <= badge_number("Ada Moreau") <= 999
        True
    """
    digest = hashlib.blake2b(normalize(name).encode("utf-8"), digest_size=8).digest()
    return 100 + int.from_bytes(digest, "big") % 900


def final_answer(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (no nested braces), or None.

    Example:
        >>> final_answer("I think \\\\boxed{12}, no: \\\\boxed{ 417 }")
        ' 417 '
        >>> final_answer("417") is None
        True
    """
    found = _BOXED.findall(text[-100_000:])
    return found[-1] if found else None


class BadgeLookupConfig(BaseResourcesServerConfig):
    """Configuration of the badge server; nothing beyond the base keys."""


class LookupBadgeRequest(BaseModel):
    """Arguments of ``lookup_badge``."""

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class LookupBadgeResponse(BaseModel):
    """Reply of ``lookup_badge``."""

    name: str
    badge: int


class SubmitAnswerRequest(BaseModel):
    """Arguments of ``submit_answer``."""

    answer: str = Field(max_length=MAX_ANSWER_CHARS)


class SubmitAnswerResponse(BaseModel):
    """Reply of ``submit_answer``: the answer as the verifier will read it."""

    answer: str
    recorded: bool = True


class BadgeLookupRunRequest(BaseRunRequest):
    """A dataset row: the prompt, the names the question asks about and the expected answer."""

    kind: str
    names: list[str] = Field(min_length=1, max_length=8)
    expected_answer: str


class BadgeLookupVerifyRequest(BadgeLookupRunRequest, BaseVerifyRequest):
    """The row plus the finished episode."""


class BadgeLookupVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the metrics (see the module docstring)."""

    answer: str | None
    answered: bool
    correct_answer: bool
    looked_up: float
    num_tool_calls: int


def _calls(output: list[Any], tool: str, key: str) -> list[str]:
    """The string argument ``key`` of every well-formed call of ``tool``, in order."""
    values = []
    for item in output:
        if getattr(item, "type", None) != "function_call" or getattr(item, "name", None) != tool:
            continue
        try:
            arguments = json.loads(item.arguments)
        except (TypeError, ValueError):
            continue
        if isinstance(arguments, dict) and isinstance(arguments.get(key), str):
            values.append(arguments[key])
    return values


def _looked_up_names(output: list[Any]) -> set[str]:
    return {normalize(name) for name in _calls(output, TOOL_NAME, "name")}


def episode_answer(output: list[Any]) -> str | None:
    """The episode's final answer: its last ``submit_answer`` call's, else the last ``\\boxed{}`` of its last
    assistant message, else None."""
    submitted = _calls(output, ANSWER_TOOL_NAME, "answer")
    return submitted[-1][:MAX_ANSWER_CHARS] if submitted else final_answer(_last_assistant_text(output))


def _last_assistant_text(output: list[Any]) -> str:
    for item in reversed(output):
        if getattr(item, "type", None) == "message" and getattr(item, "role", None) == "assistant":
            return "".join(getattr(part, "text", "") or "" for part in item.content if not isinstance(part, str))
    return ""


class BadgeLookupServer(SimpleResourcesServer):
    """The ``badge_lookup`` resources server; see the module docstring."""

    REVERIFY_MODE = "stateless"  # /verify reads only its body

    config: BadgeLookupConfig = Field(default_factory=BadgeLookupConfig)

    def setup_webserver(self) -> FastAPI:
        """Standard routes plus ``POST /lookup_badge``."""
        app = super().setup_webserver()
        app.post(f"/{TOOL_NAME}")(self.lookup_badge)
        app.post(f"/{ANSWER_TOOL_NAME}")(self.submit_answer)
        return app

    async def lookup_badge(self, body: LookupBadgeRequest) -> LookupBadgeResponse:
        """The badge number of ``body.name``."""
        return LookupBadgeResponse(name=body.name, badge=badge_number(body.name))

    async def submit_answer(self, body: SubmitAnswerRequest) -> SubmitAnswerResponse:
        """Take the final answer (the verifier reads it from the episode's call)."""
        return SubmitAnswerResponse(answer=body.answer)

    async def verify(self, body: BadgeLookupVerifyRequest) -> BadgeLookupVerifyResponse:
        """1.0 for the expected answer after looking every asked-about name up, else 0.0."""
        output = body.response.output
        answer = episode_answer(output)
        correct = answer is not None and normalize(answer) == normalize(body.expected_answer)
        wanted = {normalize(name) for name in body.names}
        looked_up = len(wanted & _looked_up_names(output)) / len(wanted)
        num_tool_calls = sum(1 for item in output if getattr(item, "type", None) == "function_call")
        fields = {**body.model_dump(), "reward": 1.0 if correct and looked_up == 1.0 else 0.0, "answer": answer,
                  "answered": answer is not None, "correct_answer": correct, "looked_up": looked_up,
                  "num_tool_calls": num_tool_calls}
        return BadgeLookupVerifyResponse(**fields)


if __name__ == "__main__":
    BadgeLookupServer.run_webserver()
