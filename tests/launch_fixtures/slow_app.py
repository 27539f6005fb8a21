"""Launcher test server that takes a second to start."""

from __future__ import annotations

import time

from fastapi import FastAPI

from nemo_gym_env.protocol.types import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym_env.server import SimpleResourcesServer


class SlowServer(SimpleResourcesServer):
    def setup_webserver(self) -> FastAPI:
        time.sleep(1.0)
        return super().setup_webserver()

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    SlowServer.run_webserver()
