"""Test server of the adapter tests (TRL and NeMo RL): secret words the model looks up with a tool.

``/seed_session`` stores the row's ``words`` in the session. ``POST /get_word {"n": int}``
answers ``{"word": words[n - 1]}`` from the session, or an error when the call carries no
seeded session's cookie (so a rollout that loses its cookies shows). ``/verify``: reward 1.0
when the last assistant message contains the row's target word (``words[target - 1]``), else
0.0, plus a random bonus below 0.01 so that the episodes of a GRPO group never tie: a 2-step
test needs a nonzero advantage to see the weights move. Metric ``called_tool`` (0/1).

Every verify reply's reward is recorded; ``GET /verify_log`` returns them in order, so tests
can compare what the trainer saw with what the server said.
"""

from __future__ import annotations

import random

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from nemo_gym_env.protocol.types import (
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
)
from nemo_gym_env.server import BaseResourcesServerConfig, SimpleResourcesServer

VERIFY_LOG: list[float] = []
"""The reward of every verify reply of this process, in order."""


class SecretWordsSeedRequest(BaseSeedSessionRequest):
    words: list[str]


class GetWordRequest(BaseModel):
    n: int


class SecretWordsVerifyRequest(BaseVerifyRequest):
    words: list[str]
    target: int


class SecretWordsServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig = Field(default_factory=BaseResourcesServerConfig)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/get_word")(self.get_word)
        app.get("/verify_log")(self.verify_log)
        return app

    async def seed_session(self, request: Request, body: SecretWordsSeedRequest) -> BaseSeedSessionResponse:
        self.sessions[self.session_id(request)] = list(body.words)
        return BaseSeedSessionResponse()

    async def get_word(self, request: Request, body: GetWordRequest) -> dict:
        words = self.sessions.get(self.session_id(request))
        if words is None:
            return {"error": "no session: call /seed_session first and send its cookie"}
        if not 1 <= body.n <= len(words):
            return {"error": f"n must be between 1 and {len(words)}"}
        return {"word": words[body.n - 1]}

    async def verify_log(self) -> dict:
        return {"rewards": VERIFY_LOG}

    async def verify(self, body: SecretWordsVerifyRequest) -> BaseVerifyResponse:
        messages = [item for item in body.response.output if getattr(item, "type", None) == "message"]
        text = "".join(getattr(part, "text", "") for part in messages[-1].content) if messages else ""
        correct = body.words[body.target - 1].lower() in text.lower()
        called = any(getattr(item, "type", None) == "function_call" for item in body.response.output)
        reward = float(correct) + 0.01 * random.random()
        VERIFY_LOG.append(reward)
        return BaseVerifyResponse(**{**body.model_dump(), "reward": reward, "called_tool": float(called)})


if __name__ == "__main__":
    SecretWordsServer.run_webserver()
