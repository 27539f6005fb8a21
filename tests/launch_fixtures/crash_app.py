"""Launcher test server that fails at start-up with a clear message."""

from __future__ import annotations

from fastapi import FastAPI

from nemo_gym_env.protocol.types import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym_env.server import SimpleResourcesServer


class CrashServer(SimpleResourcesServer):
    def setup_webserver(self) -> FastAPI:
        raise RuntimeError("launch fixture: model weights not found at /nowhere")

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)


if __name__ == "__main__":
    CrashServer.run_webserver()
