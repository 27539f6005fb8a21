"""A small deterministic OpenAI-compatible server for policy tests, run as a real process.

Routes: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``GET /v1/_stats`` (requests
seen per model name), ``GET /v1/_last/<model>`` (the last request body for a model) and
``GET /health``.

The brain: when tools are offered and the conversation has no tool output yet, it calls the
first tool, filling each string parameter with the last capitalised word of the last user
message ("... in Winnipeg?" gives ``{"city": "Winnipeg"}``); otherwise it answers
``"Done: <last tool output>"``.

Knobs ride on the model name (prefix; add a unique tail so counters do not collide):

- ``fail429-N-...``: the first N requests get 429 (with a short ``retry-after-ms``), then normal;
- ``fail500-...``: always 500;
- ``garbage-...``: 200 with a body that is not JSON; ``badshape-...``: 200 JSON of the wrong shape;
- ``hang-...``: never answers;
- ``echo-key-...``: 401 whose message repeats the bearer token it was sent;
- ``think-...``: chat replies carry ``reasoning_content``, Responses replies a reasoning item;
- ``hermes-...``: chat tool calls come as ``<tool_call>`` markup in ``content`` (no tool parser).

Token data (chat, vLLM style): with ``return_token_ids`` the reply has top-level
``prompt_token_ids`` and ``choices[0].token_ids``; with ``logprobs`` it has
``logprobs.content[*].logprob`` (tokens as ``token_id:N`` with ``return_tokens_as_token_ids``).
Tokens are the UTF-8 bytes of a fixed rendering of the conversation, built so that each
prompt extends the previous prompt plus its generation, as a well-behaved server's would.

Run: ``python tests/openai_server.py`` prints the port it bound on 127.0.0.1, then serves.
Tests use :func:`running_server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

app = FastAPI()
_seen: Counter[str] = Counter()
_last: dict[str, dict[str, Any]] = {}
_ids = itertools.count()
_WORD = re.compile(r"[A-Z][A-Za-z'\-]*")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def _last_name(text: str) -> str:
    names = [m.group(0) for m in _WORD.finditer(text) if m.start() > 0 and m.group(0) != "I"]
    return names[-1] if names else "Springfield"


def _arguments(tool: dict[str, Any], user_text: str) -> str:
    schema = tool.get("parameters") or {}
    properties = schema.get("properties") or {}
    names = schema.get("required") or list(properties)
    value = _last_name(user_text)
    return json.dumps({name: value for name in names if properties.get(name, {}).get("type", "string") == "string"})


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "test_error", "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _knob(model: str, request: Request) -> Any:
    """A canned failure for this model name, or None to answer normally."""
    _seen[model] += 1
    _last[model] = await request.json()
    if model.startswith("fail429-"):
        if _seen[model] <= int(model.split("-")[1]):
            return _error(429, "rate limited, slow down", **{"retry-after-ms": "20"})
    elif model.startswith("fail500-"):
        return _error(500, "the model crashed", **{"retry-after-ms": "20"})
    elif model.startswith("garbage-"):
        return PlainTextResponse("<html>not json at all", headers={"content-type": "application/json"})
    elif model.startswith("badshape-"):
        return JSONResponse({"hello": "world"})
    elif model.startswith("hang-"):
        await asyncio.sleep(3600)
    elif model.startswith("echo-key-"):
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        return _error(401, f"Incorrect API key provided: {token}")
    return None


# ---- chat completions ---------------------------------------------------------------------


def _render(message: dict[str, Any]) -> str:
    calls = "".join(
        f"<call {c['function']['name']} {c['function']['arguments']}>" for c in message.get("tool_calls") or []
    )
    return f"<|{message['role']}|>{_text(message.get('content'))}{calls}<|end|>"


def _token_fields(body: dict[str, Any], messages: list[dict], reply: dict[str, Any]) -> dict[str, Any]:
    prompt = ("".join(_render(m) for m in messages) + "<|assistant|>").encode()
    generation = _render(reply).removeprefix("<|assistant|>").encode()
    logprobs = [-((i % 7) + 1) / 10 for i in range(len(generation))]
    choice: dict[str, Any] = {}
    top: dict[str, Any] = {}
    if body.get("return_token_ids"):
        top["prompt_token_ids"] = list(prompt)
        choice["token_ids"] = list(generation)
    if body.get("logprobs"):
        as_ids = body.get("return_tokens_as_token_ids")
        choice["logprobs"] = {
            "content": [
                {"token": f"token_id:{b}" if as_ids else chr(b), "logprob": lp, "bytes": [b], "top_logprobs": []}
                for b, lp in zip(generation, logprobs)
            ]
        }
    return {"top": top, "choice": choice}


@app.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    body = await request.json()
    model = body.get("model", "")
    if (canned := await _knob(model, request)) is not None:
        return canned
    messages = body["messages"]
    tools = body.get("tools") or []
    user = next((_text(m.get("content")) for m in reversed(messages) if m["role"] == "user"), "")
    outputs = [m for m in messages if m["role"] == "tool"]
    n = next(_ids)
    if tools and not outputs:
        function = tools[0]["function"]
        arguments = _arguments(function, user)
        if model.startswith("hermes-"):
            call = json.dumps({"name": function["name"], "arguments": json.loads(arguments)})
            reply = {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"}
        else:
            reply = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"chatcall_{n}", "type": "function",
                     "function": {"name": function["name"], "arguments": arguments}}
                ],
            }
    else:
        reply = {"role": "assistant", "content": "Done: " + (_text(outputs[-1]["content"]) if outputs else user)}
    if model.startswith("think-"):
        reply["reasoning_content"] = "Thinking about it."
    tokens = _token_fields(body, messages, reply)
    choice = {"index": 0, "message": reply, "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
              "logprobs": None, **tokens["choice"]}
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        **tokens["top"],
    }


# ---- responses ------------------------------------------------------------------------------


@app.post("/v1/responses")
async def responses(request: Request) -> Any:
    body = await request.json()
    model = body.get("model", "")
    if (canned := await _knob(model, request)) is not None:
        return canned
    items = body["input"]
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    tools = body.get("tools") or []
    user = next(
        (_text(i.get("content")) for i in reversed(items) if i.get("type", "message") == "message" and i.get("role") == "user"),
        "",
    )
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    n = next(_ids)
    output: list[dict[str, Any]] = []
    if model.startswith("think-"):
        output.append({"type": "reasoning", "id": f"rs_srv_{n}", "summary": [{"type": "summary_text", "text": "Thinking."}]})
    if tools and not outputs:
        output.append({"type": "function_call", "id": f"fc_srv_{n}", "call_id": f"call_srv_{n}",
                       "name": tools[0]["name"], "arguments": _arguments(tools[0], user), "status": "completed"})
    else:
        text = "Done: " + (outputs[-1]["output"] if outputs else user)
        output.append({"type": "message", "id": f"msg_srv_{n}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]})
    return {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "status": "completed",
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": tools,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
    }


@app.get("/v1/_stats")
async def stats() -> dict[str, int]:
    return dict(_seen)


@app.get("/v1/_last/{model}")
async def last_request(model: str) -> dict[str, Any]:
    return _last.get(model, {})


@app.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


# ---- process --------------------------------------------------------------------------------


def _exit_with_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


def main() -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.contextmanager
def running_server(timeout_s: float = 30.0) -> Iterator[str]:
    """Start this server as a subprocess on a free loopback port; yields its ``/v1`` base URL."""
    process = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"test OpenAI server did not start (exit code {process.poll()})")
            time.sleep(0.05)
        yield f"{base}/v1"
    finally:
        process.kill()  # nothing to flush; a graceful stop would wait on hanging requests
        process.wait()
        process.stdout.close()


if __name__ == "__main__":
    main()
