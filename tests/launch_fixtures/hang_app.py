"""Launcher test server that never becomes ready (start-up hangs, as when loading a huge model)."""

from __future__ import annotations

print("launch fixture: loading forever", flush=True)  # first, so the log has it even on a busy machine

import time

from fastapi import FastAPI

from nemo_gym_env.protocol.types import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym_env.server import SimpleResourcesServer


class HangServer(SimpleResourcesServer):
    def setup_webserver(self) -> FastAPI:
        time.sleep(3600)
        return super().setup_webserver()

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)


if __name__ == "__main__":
    HangServer.run_webserver()
