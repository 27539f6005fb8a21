"""The model side of an episode: what a policy is given and what it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PolicyRequest", "PolicyTurn", "Policy"]


@dataclass
class PolicyRequest:
    """Everything a policy may look at to produce the next model turn.

    Attributes:
        input: The task's input items (system/developer/user messages), as after ``reset``.
        history: The episode's items so far: the model's own output items and the
            environment's ``function_call_output`` items, in order.
        tools: The task's tool schemas (Responses ``function`` tools).
        sampling: Sampling parameters from the task (``temperature``, ``top_p``,
            ``max_output_tokens``...), overridable per run.
        row: The whole task row (scripted policies read ground truth from it).
    """

    input: list[dict[str, Any]]
    history: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)


@dataclass
class PolicyTurn:
    """One model call's result.

    ``items`` is the env action (Responses output items). Token data, when the policy has
    it, is kept per call: ``prompt_token_ids`` is everything the model saw (and must start
    with every token of earlier calls), ``generation_token_ids`` what it produced and
    ``generation_log_probs`` their log-probabilities. :meth:`action` attaches them to the
    last item, where NeMo Gym and NeMo RL expect them.

    ``input_tokens`` and ``output_tokens`` count this call's prompt and generated tokens (0 when
    the policy has no model, or its endpoint did not say); rollouts sum them over an episode
    into the verify body's ``response.usage``.
    """

    items: list[dict[str, Any]]
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None
    text: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    def said(self) -> str:
        """The text of the turn's messages, joined (what a model playing a person said)."""
        # Deferred: protocol.items loads the wire types (pydantic models), and this module stays light.
        from nemo_gym_env.protocol.items import content_text

        return "".join(content_text(item.get("content")) for item in self.items if item.get("type") == "message")

    def action(self) -> list[dict[str, Any]]:
        """The items to pass to ``env.step``, token data on the last one when present."""
        items = [dict(item) for item in self.items]
        if items and self.generation_token_ids is not None:
            items[-1].update(
                prompt_token_ids=list(self.prompt_token_ids or []),
                generation_token_ids=list(self.generation_token_ids),
                generation_log_probs=list(self.generation_log_probs or [0.0] * len(self.generation_token_ids)),
            )
        return items


class Policy(ABC):
    """Produces model turns. Async, so thousands of episodes can share one event loop."""

    name: str = "policy"
    unreachable: str | None = None
    """Set (to the reason) by a policy that knows its model cannot be reached at all, such as an
    endpoint that refuses every connection; a rollouts run stops on it instead of failing every
    rollout the same way."""

    @abstractmethod
    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        """The next model turn for ``request``."""

    async def aclose(self) -> None:
        """Release clients or models; the default has nothing to release."""
