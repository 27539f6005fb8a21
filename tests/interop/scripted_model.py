"""A scripted, OpenAI-compatible model server, for NeMo Gym's agent to drive our servers with.

NeMo Gym's ``openai_model`` model server forwards each Responses ``create`` body the agent
sends to ``POST {openai_base_url}/responses`` and validates the reply as a ``Response``;
this server answers it with the next move of our bundled scripted players. The task and the
play come from the request's ``metadata`` (a Responses field that NeMo Gym's agent and model
server pass through untouched)::

    "metadata": {"scripted_server": "example_multi_step", "scripted_task": "3", "scripted_play": "correct"}

and the history from the ``function_call_output`` items in ``input``, as a model would see it.
It also answers ``POST /v1/chat/completions`` (NeMo Gym's ``vllm_model`` calls that) with
the same moves as Chat Completions tool calls.
"""

from __future__ import annotations

import inspect
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from nemo_gym_env.protocol.items import content_text
from nemo_gym_env.protocol.types import make_response

__all__ = ["ScriptedModelServer", "scripted_metadata"]

Player = Callable[..., list[dict[str, Any]]]

USAGE = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 15,
}
"""Usage in the shape the ``openai`` SDK that NeMo Gym pins (<=2.7.2) knows: no ``cache_write_tokens``."""


def scripted_metadata(server: str, task_index: int, correct: bool) -> dict[str, str]:
    """The ``responses_create_params.metadata`` that tells this model what to play."""
    return {"scripted_server": server, "scripted_task": str(task_index),
            "scripted_play": "correct" if correct else "wrong"}


class ScriptedModelServer:
    """Serves the scripted model on a free loopback port in a background thread.

    Args:
        rows: ``server name -> task rows`` (the rows ``scripted_task`` indexes).
        players: ``server name -> player(row, history, correct=...)``.
    """

    def __init__(self, rows: dict[str, list[dict]], players: dict[str, Player]):
        self.rows = rows
        self.players = players
        self.requests: list[dict[str, Any]] = []
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY on what it accepts (else ~40 ms a reply).
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(self._app(), log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted model server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()

    # ---- the moves ----------------------------------------------------------------------------

    def next_items(self, metadata: dict[str, Any] | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The scripted player's next output items for the episode so far."""
        metadata = metadata or {}
        server = metadata.get("scripted_server")
        if server not in self.players:
            raise ValueError(f"request metadata names no known scripted task: {metadata!r}")
        row = self.rows[server][int(metadata["scripted_task"])]
        history = [item for item in items if item.get("type") == "function_call_output"]
        player = self.players[server]
        correct = metadata.get("scripted_play") != "wrong"
        if "observations" in inspect.signature(player).parameters:  # a hosted env's player reads what it was told
            said = [content_text(item.get("content")) for item in items
                    if item.get("type", "message") == "message" and item.get("role") == "user"]
            return player(row, history, correct=correct, observations=said)
        return player(row, history, correct=correct)

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/responses")
        async def responses(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append({"route": "/v1/responses", "body": body})
            items = body["input"]
            items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else items
            output = self.next_items(body.get("metadata"), items)
            response = make_response(output, tools=body.get("tools") or [], model=body.get("model") or "scripted")
            payload = response.model_dump(mode="json", exclude_none=True)
            payload["usage"] = USAGE  # as real servers report it; NeMo Gym's agent sums it into /verify
            return JSONResponse(payload)

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append({"route": "/v1/chat/completions", "body": body})
            # Chat history -> Responses items: tool messages are the function_call_outputs.
            items = [
                {"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}
                for m in body["messages"] if m.get("role") == "tool"
            ]
            output = self.next_items(body.get("metadata"), items)
            calls = [item for item in output if item["type"] == "function_call"]
            text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = [
                    {"id": c["call_id"], "type": "function",
                     "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls
                ]
            return JSONResponse({
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or "scripted",
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            })

        return app

