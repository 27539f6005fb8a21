"""``ConversationServer``: a Gymnasium-protocol server whose agent has tools and talks to a simulated user.

Each ``POST /step`` is one agent turn, and the turn decides who answers:

- a turn with ``function_call`` items calls the server's tools (:meth:`ConversationServer.call_tool`);
  each call is answered through ``info["tool_outputs"]``, which the agent reads as tool outputs,
  and the user does not see the turn;
- a turn without one speaks to the user: its text goes to the user (:mod:`.users`), whose answer is
  the next observation, a user message. When the user ends the conversation, or has spoken
  ``max_user_turns`` times, the episode terminates and :meth:`ConversationServer.score` rewards it.

The reward is the product of the score's components (each in [0, 1]: all must hold, as in the
tau-bench family); the components, the user's turns, the tool calls and the user model's tokens
(``user_usage``, apart from the agent's) are in the last step's info, so in the rollout row. A user
that fails or times out answers the step with ``502`` and the error: the episode is a failure row.

A subclass gives its episode state, tools and score::

    class Shop(ConversationServer):
        def start(self, row):                     # the episode's state, from the row
            return {"orders": dict(row["orders"])}

        def call_tool(self, state, name, arguments):
            if name != "cancel":
                raise ToolError(f"no tool {name!r}")
            state["orders"][arguments["order_id"]] = "cancelled"
            return {"ok": True}

        def score(self, state, row, talk):
            return {"state": float(state["orders"] == row["expected"])}

The row holds ``user`` (a :class:`~nemo_gym_env.conversation.users.UserSpec`) next to
``responses_create_params`` (the agent's system prompt and tool schemas). The server's YAML picks
the user: ``user: scripted`` (the default) or ``user: policy`` with ``user_policy`` (the arguments
of ``make_policy``: ``{kind: local}`` for the embedded model, ``{kind: openai, base_url: ..., model: ...}``).
"""

from __future__ import annotations

import json
import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fastapi import HTTPException
from pydantic import Field, PrivateAttr, ValidationError

from nemo_gym_env.conversation.users import Talk, User, UserSpec, make_user
from nemo_gym_env.errors import ToolError, UserFailure
from nemo_gym_env.protocol.types import Response
from nemo_gym_env.server.base import BaseResourcesServerConfig
from nemo_gym_env.server.gymnasium import GymnasiumServer, extract_text

__all__ = ["ConversationConfig", "ConversationServer"]

MAX_CALLS_A_TURN = 16
"""Tool calls answered in one agent turn; more are answered with an error each."""


class ConversationConfig(BaseResourcesServerConfig):
    """A conversational server's YAML keys: who plays the user and how long a conversation may run."""

    user: Literal["scripted", "policy"] = "scripted"
    user_policy: dict[str, Any] = Field(default_factory=lambda: {"kind": "local"})
    """With ``user: policy``: ``make_policy``'s arguments (``kind``: ``local`` or ``openai``, and theirs)."""
    user_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    user_max_output_tokens: int = Field(default=96, ge=1, le=4096)
    max_user_turns: int = Field(default=8, ge=1, le=100)
    """The user's messages after the opening; at the last, the conversation ends and is scored."""


@dataclass
class _Episode:
    talk: Talk
    state: Any
    tool_calls: int = 0


class ConversationServer(GymnasiumServer):
    """Base class of conversational servers; see the module docstring."""

    REVERIFY_MODE: ClassVar[str] = "unsupported"  # scored when the user ends the talk, there is no /verify

    config: ConversationConfig = Field(default_factory=ConversationConfig)
    _user: User | None = PrivateAttr(default=None)

    @property
    def user(self) -> User:
        """The user player the config names, built on first use."""
        if self._user is None:
            self._user = make_user(self.config.user, self.config.user_policy, timeout_s=self.config.user_timeout_s,
                                   max_output_tokens=self.config.user_max_output_tokens)
        return self._user

    # ---- what a subclass gives ---------------------------------------------------------------------

    @abstractmethod
    def start(self, row: dict[str, Any]) -> Any:
        """The episode's state from the task row; a ``ValueError`` (a pydantic ``ValidationError`` too) refuses
        the row (422, naming the first error's place)."""

    @abstractmethod
    def call_tool(self, state: Any, name: str, arguments: dict[str, Any]) -> Any:
        """Run one tool call on ``state``; the JSON-able result is the tool output. Raise
        :class:`ToolError` to refuse it (the agent reads the message)."""

    @abstractmethod
    def score(self, state: Any, row: dict[str, Any], talk: Talk) -> dict[str, float]:
        """The ended conversation's reward components, each in [0, 1]."""

    # ---- the protocol ------------------------------------------------------------------------------

    async def reset(self, metadata: dict, session_id: str | None = None) -> tuple[str | None, dict]:
        """Validate the row's ``user``, build the episode's state; the user's opening is the first observation."""
        try:
            spec = UserSpec.model_validate(metadata.get("user"))
        except ValidationError as exc:
            raise HTTPException(422, f"the row's user is not a user spec: {_first_error(exc)}") from None
        try:
            state = self.start(metadata)
        except ValidationError as exc:  # a subclass validating its part of the row (a pydantic model)
            raise HTTPException(422, f"the row cannot start an episode: {_first_error(exc)}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise HTTPException(422, f"the row cannot start an episode: {str(exc)[:300]}") from None
        self.session_state[session_id] = _Episode(Talk(spec), state)
        return spec.opening, {}

    async def step(self, action: Response, metadata: dict,
                   session_id: str | None = None) -> tuple[str | None, float, bool, bool, dict]:
        """Answer the turn's tool calls, or take its text to the user; score the talk when it ends."""
        episode: _Episode = self.session_state[session_id]
        calls = [item for item in action.output if getattr(item, "type", None) == "function_call"]
        if calls:
            outputs = [self.tool_output(call, self._call(episode, call.name, call.arguments, n))
                       for n, call in enumerate(calls)]
            episode.tool_calls += len(calls)
            return None, 0.0, False, False, {"tool_outputs": outputs, **self._counts(episode)}
        try:
            said, ended = await self.user.reply(episode.talk, extract_text(action).strip())
        except UserFailure as exc:
            raise HTTPException(502, f"user: {exc}") from None
        talk = episode.talk
        if not ended and talk.user_turns < self.config.max_user_turns:
            return said, 0.0, False, False, self._counts(episode)
        components = {name: float(value) for name, value in self.score(episode.state, metadata, talk).items()}
        bad = [name for name, value in components.items() if not (math.isfinite(value) and 0.0 <= value <= 1.0)]
        if bad:
            raise ValueError(f"score() gave components outside [0, 1]: {', '.join(bad)}")
        reward = math.prod(components.values()) if components else 0.0
        info = {**components, **self._counts(episode), "ended_by": "user" if ended else "turn_limit",
                "user_said_last": said, "conversation": list(talk.said)}
        return None, reward, True, False, info

    def _call(self, episode: _Episode, name: str, arguments: str, n: int) -> Any:
        if n >= MAX_CALLS_A_TURN:
            return {"error": f"at most {MAX_CALLS_A_TURN} tool calls a turn"}
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError:
            return {"error": f"the arguments of {name} are not JSON: {arguments[:100]!r}"}
        if not isinstance(parsed, dict):
            return {"error": f"the arguments of {name} are not a JSON object"}
        try:
            return self.call_tool(episode.state, name, parsed)
        except ToolError as exc:
            return {"error": str(exc)[:1000]}

    @staticmethod
    def _counts(episode: _Episode) -> dict[str, Any]:
        return {"user_turns": episode.talk.user_turns, "tool_calls": episode.tool_calls,
                "user_usage": dict(episode.talk.user_usage)}


def _first_error(exc: ValidationError) -> str:
    error = exc.errors(include_input=False)[0]
    return f"{'.'.join(str(part) for part in error['loc']) or '(the object)'}: {error['msg']}"
