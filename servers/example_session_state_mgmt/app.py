"""``example_session_state_mgmt``: a per-session counter the model increments and reads.

``/seed_session`` starts the session's counter at the row's ``initial_count``. The model
follows the user's instructions with the tools, and the verifier checks the counter the
session ended with.

Tools:
    ``POST /increment_counter`` ``{"count": int}`` -> ``{"success": true}``.
    ``POST /get_counter_value`` ``{}`` (or no body) -> ``{"count": int}``.

Reward: ``1.0`` when the session's counter equals the row's ``expected_count``, else 0.0.
A ``/verify`` whose cookie reaches no session state (never seeded, cookie not sent, or a
forged cookie) gets 0.0 with ``failure_reason``.

As in NeMo Gym, a tool call in a session that was never seeded starts that session's
counter at 0. State lives in :attr:`SimpleResourcesServer.sessions`: bounded, expiring,
and freed once ``/verify`` has answered.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)

__all__ = [
    "NO_SESSION_REASON",
    "GetCounterValueRequest",
    "GetCounterValueResponse",
    "IncrementCounterRequest",
    "IncrementCounterResponse",
    "StatefulCounterResourcesServer",
    "StatefulCounterResourcesServerConfig",
    "StatefulCounterSeedSessionRequest",
    "StatefulCounterVerifyRequest",
]

NO_SESSION_REASON = "no session state: call /seed_session first and send its cookie"
"""``failure_reason`` of a ``/verify`` that reaches no session state."""


class StatefulCounterResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the counter server; nothing beyond the base keys."""


class StatefulCounterSeedSessionRequest(BaseSeedSessionRequest):
    """Body of ``/seed_session``: the dataset row, whose ``initial_count`` starts the counter."""

    initial_count: int


class IncrementCounterRequest(BaseModel):
    """Arguments of ``increment_counter`` (negative counts decrement)."""

    count: int


class IncrementCounterResponse(BaseModel):
    """Reply of ``increment_counter``."""

    success: bool


class GetCounterValueRequest(BaseModel):
    """Arguments of ``get_counter_value``: none, so ``{}`` (unknown keys are ignored)."""


class GetCounterValueResponse(BaseModel):
    """Reply of ``get_counter_value``."""

    count: int


class StatefulCounterVerifyRequest(BaseVerifyRequest):
    """The row plus the finished episode; ``expected_count`` is the ground truth."""

    expected_count: int


class StatefulCounterResourcesServer(SimpleResourcesServer):
    """The ``example_session_state_mgmt`` resources server."""

    REVERIFY_MODE = "unsupported"  # /verify reads the session's counter, gone once verified

    config: StatefulCounterResourcesServerConfig = Field(default_factory=StatefulCounterResourcesServerConfig)

    def setup_webserver(self) -> FastAPI:
        """Standard routes plus the two counter tools."""
        app = super().setup_webserver()
        app.post("/increment_counter")(self.increment_counter)
        app.post("/get_counter_value")(self.get_counter_value)
        return app

    async def seed_session(
        self, request: Request, body: StatefulCounterSeedSessionRequest
    ) -> BaseSeedSessionResponse:
        """Start (or restart) this session's counter at ``body.initial_count``."""
        self.sessions[self.session_id(request)] = body.initial_count
        return BaseSeedSessionResponse()

    async def increment_counter(
        self, request: Request, body: IncrementCounterRequest
    ) -> IncrementCounterResponse:
        """Add ``body.count`` to this session's counter."""
        session_id = self.session_id(request)
        self.sessions[session_id] = self.sessions.get(session_id, 0) + body.count
        return IncrementCounterResponse(success=True)

    async def get_counter_value(
        self, request: Request, body: GetCounterValueRequest | None = None
    ) -> GetCounterValueResponse:
        """This session's counter (0 in a session that was never seeded; reading stores nothing)."""
        return GetCounterValueResponse(count=self.sessions.get(self.session_id(request), 0))

    async def verify(self, request: Request, body: StatefulCounterVerifyRequest) -> BaseVerifyResponse:
        """1.0 when the session's counter equals ``expected_count``; 0.0 (with a reason) without a session."""
        fields = body.model_dump()
        session_id = self.session_id(request)
        if session_id not in self.sessions:
            return BaseVerifyResponse(**{**fields, "reward": 0.0, "failure_reason": NO_SESSION_REASON})
        counter = self.sessions[session_id]
        return BaseVerifyResponse(**{**fields, "reward": float(counter == body.expected_count)})


if __name__ == "__main__":
    StatefulCounterResourcesServer.run_webserver()
