"""The user's side of a conversation: who the user is (:class:`UserSpec`) and who plays them.

A task row of a conversational server carries a ``user`` object: the user's persona, goal and
the details they give only when asked. Two players read it:

- :class:`ScriptedUser`, deterministic, for tests and baselines: it opens with the row's
  ``opening``, gives a detail when the agent's message names one of its ``asked_by`` words,
  agrees when asked to confirm, ends (:data:`STOP`) once the agent says one of ``done_by``, and
  otherwise repeats its ``fallback``;
- :class:`PolicyUser`, a model: any policy of ours (``{kind: local}`` for the embedded model,
  ``{kind: openai, base_url: ..., model: ...}`` for an OpenAI-compatible endpoint), told the
  persona, goal and details in a system prompt, the agent's messages as the other side's. It
  ends the conversation by writing :data:`STOP`. Its tokens are counted apart from the agent's.

A user that fails (an error, a timeout, an empty message) raises :class:`UserFailure`; the server
answers the step with an error and the episode is a failure row, never a reward.

Example:
    >>> spec = UserSpec(opening="Hi, where is my parcel?", details=[
    ...     UserDetail(asked_by=["email"], say="It's ana@example.com.")], done_by=["1Z42"])
    >>> user = ScriptedUser()
    >>> talk = Talk(spec)
    >>> asyncio.run(user.reply(talk, "Could you give me your email?"))
    ("It's ana@example.com.", False)
    >>> asyncio.run(user.reply(talk, "Your parcel's tracking number is 1Z42."))[1]
    True
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym_env.errors import UserFailure

__all__ = ["STOP", "PolicyUser", "ScriptedUser", "Talk", "User", "UserDetail", "UserSpec",
           "make_user"]

STOP = "###STOP###"
"""What a user writes to end the conversation (the tau-bench convention); never shown to the agent."""

_CONFIRM_BY = ["confirm", "proceed", "shall i", "should i", "go ahead", "would you like me", "do you want me"]
_MAX_TEXT = 4000


class UserDetail(BaseModel):
    """One thing the user knows and says only when asked: when the agent's message holds one of
    ``asked_by`` (case-insensitive), the scripted user says ``say``, once."""

    model_config = ConfigDict(extra="forbid")

    asked_by: list[str] = Field(min_length=1, max_length=16)
    say: str = Field(min_length=1, max_length=2000)


class UserSpec(BaseModel):
    """The task row's ``user``: who the user is and what they want (hidden from the agent)."""

    model_config = ConfigDict(extra="forbid")

    opening: str = Field(min_length=1, max_length=2000)
    """The user's first message (the episode's first observation)."""
    persona: str = Field(default="", max_length=2000)
    goal: str = Field(default="", max_length=2000)
    """What the user wants, in the user's words (a model user is told it)."""
    details: list[UserDetail] = Field(default_factory=list, max_length=32)
    confirm: str = Field(default="Yes, please go ahead.", max_length=2000)
    confirm_by: list[str] = Field(default_factory=lambda: list(_CONFIRM_BY), max_length=32)
    done_by: list[str] = Field(default_factory=list, max_length=32)
    """Words in the agent's message after which the scripted user thanks and ends."""
    thanks: str = Field(default="Thank you, that is all I needed.", max_length=2000)
    fallback: str = Field(default="Can you help me with my request?", max_length=2000)


@dataclass
class Talk:
    """One conversation as the user sees it: the spec, what each side said, the user's tokens."""

    spec: UserSpec
    said: list[dict[str, str]] = field(default_factory=list)
    """``{"role": "user" | "agent", "text": ...}`` in order, the opening first."""
    given: set[int] = field(default_factory=set)
    user_usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 0, "output_tokens": 0})

    def __post_init__(self) -> None:
        if not self.said:
            self.said.append({"role": "user", "text": self.spec.opening})

    @property
    def user_turns(self) -> int:
        """The user's messages after the opening request."""
        return sum(1 for line in self.said if line["role"] == "user") - 1


class User:
    """Plays the user: :meth:`reply` answers the agent's message; True in the pair ends the talk."""

    async def reply(self, talk: Talk, agent_said: str) -> tuple[str, bool]:
        """The user's answer to ``agent_said`` (recorded in ``talk``), and whether the user ended the talk."""
        talk.said.append({"role": "agent", "text": agent_said[:_MAX_TEXT]})
        text = await self._answer(talk, agent_said)
        ended = STOP in text
        text = text.replace(STOP, "").strip()
        if not text and not ended:
            raise UserFailure(f"{type(self).__name__}: the user said nothing")
        talk.said.append({"role": "user", "text": text[:_MAX_TEXT]})
        return text, ended

    async def _answer(self, talk: Talk, agent_said: str) -> str:
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the user holds (a model's client)."""


class ScriptedUser(User):
    """The deterministic user of the module docstring: reveals, confirms, ends or repeats its fallback."""

    async def _answer(self, talk: Talk, agent_said: str) -> str:
        spec, text = talk.spec, agent_said.lower()
        revealed = []
        for index, detail in enumerate(spec.details):
            if index not in talk.given and any(word.lower() in text for word in detail.asked_by):
                talk.given.add(index)
                revealed.append(detail.say)
        if revealed:
            return " ".join(revealed)
        if any(word.lower() in text for word in spec.done_by):
            return f"{spec.thanks} {STOP}"
        if any(word.lower() in text for word in spec.confirm_by):
            return spec.confirm
        return spec.fallback


class PolicyUser(User):
    """A model plays the user, through any policy of ours; see the module docstring.

    Args:
        policy: ``make_policy``'s arguments (``kind`` among them; ``local`` when absent). The
            policy is built on first use, so a server whose rows never reach a user loads no model.
        timeout_s: The longest one user message may take; past it, :class:`UserFailure`.
        max_output_tokens: The user's budget a message.
    """

    def __init__(self, policy: dict[str, Any], *, timeout_s: float = 60.0, max_output_tokens: int = 96):
        self.policy_kwargs = dict(policy)
        self.timeout_s = timeout_s
        self.max_output_tokens = max_output_tokens
        self._policy: Any = None

    def _make(self) -> Any:
        from nemo_gym_env.policies.factory import make_policy

        kwargs = dict(self.policy_kwargs)
        return make_policy(kwargs.pop("kind", "local"), **kwargs)

    @staticmethod
    def system_prompt(spec: UserSpec) -> str:
        """What the user model is told: who it plays, what it wants, what it may say, how to end."""
        details = "\n".join(f"- {detail.say}" for detail in spec.details) or "- (none)"
        return (
            "You are role-playing a customer writing to a support agent. Write only the customer's next "
            "message, short and plain.\n"
            f"Who you are: {spec.persona or 'a customer'}\n"
            f"What you want: {spec.goal or spec.opening}\n"
            f"Details you know; give one only when the agent asks for it, and never invent others:\n{details}\n"
            "If the agent asks you to confirm what you want, say yes. When your request is done, or cannot "
            f"be done, thank the agent and end your message with {STOP}"
        )

    async def _answer(self, talk: Talk, agent_said: str) -> str:
        from nemo_gym_env.policies.base import PolicyRequest

        if self._policy is None:
            self._policy = self._make()
        # The user model's own messages are its assistant turns; the agent's are its user turns.
        messages = [{"type": "message", "role": "system", "content": self.system_prompt(talk.spec)}]
        messages += [{"type": "message", "role": "assistant" if line["role"] == "user" else "user",
                      "content": line["text"]} for line in talk.said]
        request = PolicyRequest(input=messages, history=[], sampling={"max_output_tokens": self.max_output_tokens})
        try:
            turn = await asyncio.wait_for(self._policy.generate(request), self.timeout_s)
        except TimeoutError as exc:
            raise UserFailure(f"the user model did not answer within {self.timeout_s:g} s") from exc
        except UserFailure:
            raise
        except Exception as exc:  # whatever the user's model raises fails the episode, never the server
            raise UserFailure(f"the user model failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
        talk.user_usage["input_tokens"] += int(turn.input_tokens or 0)
        talk.user_usage["output_tokens"] += int(turn.output_tokens or 0)
        return turn.said()

    async def close(self) -> None:
        closing = getattr(self._policy, "aclose", None)
        if closing is not None:
            await closing()


def make_user(kind: str, policy: dict[str, Any] | None = None, *, timeout_s: float = 60.0,
              max_output_tokens: int = 96) -> User:
    """``scripted`` or ``policy`` (a :class:`PolicyUser` of ``policy``, the arguments of ``make_policy``).

    Raises:
        ValueError: another kind.
    """
    if kind == "scripted":
        return ScriptedUser()
    if kind == "policy":
        return PolicyUser(policy or {"kind": "local"}, timeout_s=timeout_s, max_output_tokens=max_output_tokens)
    raise ValueError(f"unknown user {kind!r}: expected scripted or policy")
