"""Launcher test server that works: GET / plus an ``echo`` tool and a ``pid`` route."""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, Request

from nemo_gym_env.protocol.types import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym_env.server import BaseResourcesServerConfig, SimpleResourcesServer


class EchoServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/echo")(self.echo)
        app.get("/pid")(self.pid)
        return app

    async def echo(self, request: Request) -> dict[str, Any]:
        return {"echo": await request.json(), "name": self.config.name}

    async def pid(self) -> dict[str, int]:
        return {"pid": os.getpid()}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


if __name__ == "__main__":
    EchoServer.run_webserver()
