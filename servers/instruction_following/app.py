"""``instruction_following``: IFEval-style verifiable instructions, no tools.

A row carries ``instruction_id_list`` (e.g. ``["punctuation:no_comma",
"length_constraints:number_words"]``) and ``kwargs``, one dict (or ``null``) per id, as in
IFEval and NeMo Gym's ``instruction_following``. The model answers in one message; the text of
the *last* assistant message is checked against every instruction (reasoning items and
earlier messages are ignored). The instructions live in ``instructions.py``.

Reward: ``grading_mode`` ``binary`` (default): 1.0 iff every instruction is followed;
``fraction``: the share followed, and ``reward_components`` (NeMo Gym 0.7's multi-reward reply):
one per instruction, named by its id (``#2``, ``#3``... for repeats), worth ``1/n`` when followed
and 0 when not, so they sum to ``reward``. (A binary reward is not a sum of per-instruction parts,
so binary grading gives no components.) A row's ``grading_mode`` overrides the server's. Metrics:
``follow_all_instructions``, ``follow_instruction_list`` and ``instruction_results``
(``[{id, followed, detail}]``). An unknown instruction id or bad kwargs give reward 0 with
``failure_kind: invalid_instruction`` and a ``failure_reason`` naming it; no answer gives
``no_answer``; a text over ``max_response_chars`` is not analysed (``response_too_long``).

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym_env.servers.instruction_following.instructions import Instruction, InstructionError, build

__all__ = [
    "GradingMode",
    "InstructionFollowingResourcesServer",
    "InstructionFollowingResourcesServerConfig",
    "InstructionFollowingRunRequest",
    "InstructionFollowingVerifyRequest",
    "InstructionFollowingVerifyResponse",
    "InstructionResult",
    "instruction_components",
    "last_assistant_text",
]

GradingMode = Literal["binary", "fraction"]


class InstructionFollowingResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the instruction-following server.

    Attributes:
        grading_mode: ``binary`` (1.0 iff all instructions are followed) or ``fraction``
            (the share followed); a row's own ``grading_mode`` wins.
        max_response_chars: Longer answers are not analysed (reward 0,
            ``failure_kind: response_too_long``): bounds the work per verification.
    """

    grading_mode: GradingMode = "binary"
    max_response_chars: int = Field(default=200_000, ge=1)


class InstructionFollowingRunRequest(BaseRunRequest):
    """A dataset row: the prompt plus the instructions to check (IFEval's fields)."""

    id: int | str | None = None
    prompt: str | None = None
    instruction_id_list: list[str] = Field(min_length=1)
    kwargs: list[dict[str, Any] | None]
    grading_mode: GradingMode | None = None

    @model_validator(mode="after")
    def _aligned(self) -> InstructionFollowingRunRequest:
        if len(self.kwargs) != len(self.instruction_id_list):
            raise ValueError(
                f"kwargs has {len(self.kwargs)} entries but instruction_id_list has "
                f"{len(self.instruction_id_list)}: give one dict (or null) per instruction"
            )
        return self


class InstructionFollowingVerifyRequest(InstructionFollowingRunRequest, BaseVerifyRequest):
    """The row plus the finished episode."""


class InstructionResult(BaseModel):
    """How one instruction fared: its id, whether it was followed, and why."""

    id: str
    followed: bool
    detail: str


class InstructionFollowingVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the metrics.

    Attributes:
        follow_all_instructions: Every instruction was followed.
        follow_instruction_list: Followed or not, one per instruction id, in order.
        instruction_results: ``{id, followed, detail}`` per instruction, in order.
        grading_mode: The mode the reward was computed with.
        reward_components: ``fraction`` grading only: see :func:`instruction_components`.
    """

    follow_all_instructions: bool
    follow_instruction_list: list[bool]
    instruction_results: list[InstructionResult]
    grading_mode: GradingMode


def instruction_components(instruction_ids: list[str], followed: list[bool]) -> dict[str, float]:
    """``fraction`` grading's reward components: ``1/n`` per followed instruction, keyed by its id.

    Example:
        >>> instruction_components(["a", "b", "a"], [True, False, True])
        {'a': 0.3333333333333333, 'b': 0.0, 'a#2': 0.3333333333333333}
    """
    out: dict[str, float] = {}
    share = 1.0 / len(followed)
    for instruction_id, ok in zip(instruction_ids, followed):
        name, n = instruction_id, 1
        while name in out:
            n += 1
            name = f"{instruction_id}#{n}"
        out[name] = share if ok else 0.0
    return out


def last_assistant_text(output: list[Any]) -> str | None:
    """Text of the last assistant message in ``output`` (its ``output_text`` parts joined), or ``None``."""
    for item in reversed(output):
        if getattr(item, "type", None) == "message" and getattr(item, "role", None) == "assistant":
            content = getattr(item, "content", None)
            if isinstance(content, str):
                return content
            return "".join(
                getattr(part, "text", "") or ""
                for part in content or ()
                if getattr(part, "type", None) == "output_text"
            )
    return None


class InstructionFollowingResourcesServer(SimpleResourcesServer):
    """The ``instruction_following`` resources server (no tools, only ``/verify``)."""

    config: InstructionFollowingResourcesServerConfig = Field(
        default_factory=InstructionFollowingResourcesServerConfig
    )

    async def verify(self, body: InstructionFollowingVerifyRequest) -> InstructionFollowingVerifyResponse:
        """Check the last assistant message against every instruction of the row."""
        mode: GradingMode = body.grading_mode or self.config.grading_mode
        rules: list[Instruction | None] = []
        errors: list[str] = []
        for instruction_id, kwargs in zip(body.instruction_id_list, body.kwargs):
            try:
                rules.append(build(instruction_id, kwargs))
            except InstructionError as exc:
                rules.append(None)
                errors.append(str(exc))

        text = last_assistant_text(body.response.output)
        unreadable: tuple[str, str] | None = None
        if text is None or not text.strip():
            unreadable = ("no_answer", "no assistant message with text in the response")
        elif len(text) > self.config.max_response_chars:
            unreadable = (
                "response_too_long",
                f"the answer has {len(text)} characters, over max_response_chars={self.config.max_response_chars}",
            )
        failure = ("invalid_instruction", "; ".join(errors)) if errors else unreadable

        results = []
        for instruction_id, rule in zip(body.instruction_id_list, rules):
            if rule is None:
                results.append(
                    InstructionResult(id=instruction_id, followed=False, detail="invalid instruction")
                )
            elif unreadable is not None:
                results.append(InstructionResult(id=instruction_id, followed=False, detail=unreadable[0]))
            else:
                check = rule.check(text)
                results.append(
                    InstructionResult(id=instruction_id, followed=check.followed, detail=check.detail)
                )

        followed = [r.followed for r in results]
        if failure is not None:
            reward = 0.0
        elif mode == "binary":
            reward = float(all(followed))
        else:
            reward = sum(followed) / len(followed)
        fields: dict[str, Any] = {
            **body.model_dump(),
            "reward": reward,
            "follow_all_instructions": all(followed),
            "follow_instruction_list": followed,
            "instruction_results": results,
            "grading_mode": mode,
        }
        # A re-verified rollout row may carry an earlier failure: only this verification's counts.
        fields.pop("failure_kind", None)
        fields.pop("failure_reason", None)
        fields.pop("reward_components", None)
        if mode == "fraction":
            # A failure scores 0: so do its parts.
            fields["reward_components"] = instruction_components(
                body.instruction_id_list, [False] * len(followed) if failure is not None else followed)
        if failure is not None:
            fields["failure_kind"], fields["failure_reason"] = failure
        return InstructionFollowingVerifyResponse(**fields)


if __name__ == "__main__":
    InstructionFollowingResourcesServer.run_webserver()
