"""A deterministic OpenAI-compatible model process that solves NeMo Gym's example tasks.

It is :class:`tests.interop.scripted_model.ScriptedModelServer` (the scripted model the interop
tests drive NeMo Gym's agent with) run as its own process, told the task by the prompt instead
of request metadata: a client that sends only the task's messages (our ``OpenAIPolicy``, or NeMo
Gym's ``openai_model``) on ``POST /v1/responses`` gets the next move of the task's scripted player
(:data:`tests.interop.players.PLAYERS`, written for NeMo Gym's own ``data/example.jsonl`` rows).

``GET /v1/_timing`` reports the wall-clock time of the first model request and of the last reply
and the request count (``POST /v1/_timing/reset`` starts over): what ``vs_nemo_gym.py`` measures
throughput by, on both sides alike.

Run: ``python benchmarks/scripted_model.py SERVER=ROWS.jsonl ...`` prints its ``/v1`` URL, then
serves until its stdin closes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.interop.players import PLAYERS  # noqa: E402
from tests.interop.scripted_model import ScriptedModelServer  # noqa: E402

_PROMPT_ROLES = ("system", "developer", "user")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def prompt_key(messages: list[dict[str, Any]]) -> str:
    """The texts of the leading system/developer/user messages: what identifies a task."""
    texts = []
    for message in messages:
        if message.get("type", "message") != "message" or message.get("role") not in _PROMPT_ROLES:
            break
        texts.append(_text(message.get("content")))
    return "\x1e".join(texts)


class PromptScriptedModel(ScriptedModelServer):
    """The scripted model, finding each request's task by its prompt; timed at the ASGI boundary."""

    def __init__(self, rows: dict[str, list[dict[str, Any]]]):
        super().__init__(rows, {server: PLAYERS[server] for server in rows})
        self.by_prompt: dict[str, tuple[str, int]] = {}
        for server, server_rows in rows.items():
            for index, row in enumerate(server_rows):
                key = prompt_key(row["responses_create_params"]["input"])
                other = self.by_prompt.setdefault(key, (server, index))
                if other != (server, index) and rows[other[0]][other[1]] != row:
                    raise ValueError(f"two different tasks share a prompt: {other} and {(server, index)}")
        self.timing: dict[str, Any] = {"first": None, "last": None, "requests": 0}

    def next_items(self, metadata: dict[str, Any] | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if metadata and metadata.get("scripted_server"):
            return super().next_items(metadata, items)
        found = self.by_prompt.get(prompt_key(items))
        if found is None:  # Chat Completions requests reach here without their prompt: Responses only
            raise ValueError("no task has this prompt (the prompt-keyed model serves POST /v1/responses)")
        server, index = found
        history = [item for item in items if item.get("type") == "function_call_output"]
        return self.players[server](self.rows[server][index], history, correct=True)

    def _app(self) -> Any:
        app = super()._app()
        self.requests = _Forgetful()  # the base class keeps every body; a benchmark would grow without end

        async def timed(scope: dict, receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith("/v1/_timing"):
                await self._timing_route(scope, receive, send)
                return
            if scope["type"] != "http" or not path.startswith("/v1/"):
                await app(scope, receive, send)
                return
            self.timing["requests"] += 1
            if self.timing["first"] is None:
                self.timing["first"] = time.time()

            async def timed_send(message: dict) -> None:
                await send(message)
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    self.timing["last"] = time.time()

            await app(scope, receive, timed_send)

        return timed

    async def _timing_route(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["method"] == "POST":
            self.timing.update(first=None, last=None, requests=0)
        payload = json.dumps(self.timing).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


class _Forgetful(list):
    """A list that keeps nothing (the base class appends every request body to ``requests``)."""

    def append(self, item: Any) -> None:
        pass


def main() -> None:
    rows: dict[str, list[dict[str, Any]]] = {}
    for arg in sys.argv[1:]:
        server, _, path = arg.partition("=")
        rows[server] = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    with PromptScriptedModel(rows) as model:
        print(model.base_url, flush=True)
        sys.stdin.read()  # until the parent closes its end (or dies)


if __name__ == "__main__":
    main()
