"""An HTTP ``/seed_session`` also opens the episode to MCP (NeMo Gym 0.7's way).

NeMo Gym 0.7's agents seed over HTTP, call the tools over MCP with the token the seed reply hands
them, and verify over HTTP with the session cookie. :class:`McpSeedMiddleware` gives a successful
HTTP seed's reply that token, in 0.7's shape: under ``"mcp"`` for a row body, as
``resources_tools`` for 0.7's typed body::

    {"server_name": "<instance>", "url_path": "/mcp", "transport": "http",
     "headers": {"X-NeMo-Gym-Session-Token": "<token>"}}

MCP calls with that header then act in the very session the cookie names.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from nemo_gym_env.server.mcp_episodes import (
    INNER_HEADER,
    MCP_PATH,
    SESSION_TOKEN_HEADER,
    McpEpisode,
    new_token,
)
from nemo_gym_env.server.middleware import read_body, replay_body, typed_seed

__all__ = ["MCP_METADATA_KEY", "McpSeedMiddleware"]

MCP_METADATA_KEY = "mcp"
"""Key of the MCP access in a row-body seed reply (NeMo Gym 0.7's name)."""


class Exposure(Protocol):
    """What the middleware needs of the exposure it serves (``mcp_expose.McpExposure``, which imports this module)."""

    server: Any
    runner: Any

    def add_episode(self, episode: McpEpisode) -> None: ...


def _cookies(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    found = {}
    for key, value in headers:
        if key.lower() == b"set-cookie":
            name, sep, rest = value.decode("latin-1").partition("=")
            if sep:
                found[name.strip()] = rest.split(";", 1)[0].strip()
    return found


class McpSeedMiddleware:
    """Pure ASGI, on ``POST /seed_session`` only; see the module docstring."""

    def __init__(self, app: Any, exposure: Exposure):
        self.app = app
        self.exposure = exposure

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope.get("path") != "/seed_session" or scope.get("method") != "POST"
                or any(k == INNER_HEADER.encode() for k, _ in scope.get("headers", ()))):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return
        start: dict | None = None
        chunks: list[bytes] = []

        async def hold(message: dict) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    await self._answer(start or {}, b"".join(chunks), body, send)
            else:
                await send(message)

        await self.app(scope, replay_body(body, receive), hold)

    async def _answer(self, start: dict, reply: bytes, body: bytes, send: Any) -> None:
        status = start.get("status", 500)
        payload = _json(reply) if 200 <= status < 300 else None
        if isinstance(payload, dict):
            typed = typed_seed(body)
            row = typed[2] if typed is not None else _json(body)
            headers = list(start.get("headers", []))
            token = self._open(row if isinstance(row, dict) else {}, _cookies(headers))
            access = {"server_name": self.exposure.server.config.name or type(self.exposure.server).__name__,
                      "url_path": MCP_PATH, "transport": "http", "headers": {SESSION_TOKEN_HEADER: token}}
            if typed is not None:
                payload["resources_tools"] = payload.get("resources_tools") or access
            else:
                payload.setdefault(MCP_METADATA_KEY, access)
            reply = json.dumps(payload).encode()
            start = {**start, "headers": [(k, str(len(reply)).encode() if k == b"content-length" else v)
                                          for k, v in headers]}
        await send(start)
        await send({"type": "http.response.body", "body": reply})

    def _open(self, row: dict[str, Any], cookies: dict[str, str]) -> str:
        client = self.exposure.runner.new_client()
        for name, value in cookies.items():
            client.cookies.set(name, value)
        episode = McpEpisode(token=new_token(), row=row, task_index=None, client=client)
        self.exposure.add_episode(episode)
        return episode.token


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None
