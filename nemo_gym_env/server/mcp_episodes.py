"""Episodes played over MCP, inside the resources server that serves them.

An MCP client's episode is an ordinary resources-server session: :class:`EpisodeRunner` sends
``/seed_session``, the tool routes, ``/verify`` and ``/close_session`` to the server's own app
in process (through every middleware, as a request from the network would go), with the
episode's own cookie jar, and records the episode's items as the env records them, so the same
moves score the same reward over MCP as through ``gym.make``. Every call is bounded by a timeout,
and an episode's recorded items by ``max_trajectory_bytes``: a call whose arguments would pass it
is refused before it runs, an output that would pass it is kept (and returned) cut to what fits,
with a note, so the episode's ``/verify`` body always fits the server's body limit and scores.

A Gymnasium-protocol server (``gymnasium=True``) is played the same way through its own routes:
``/reset`` starts the episode, and each tool call, or each message (:meth:`EpisodeRunner.say`: to a
conversational server's simulated user), is one ``/step`` whose reply is the tool's output, or the
next observation, with the step's reward and whether the episode ended.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx

from nemo_gym_env.errors import McpError
from nemo_gym_env.protocol.keys import STEP_REWARD_HEADER
from nemo_gym_env.protocol.types import make_response, new_id

__all__ = ["INNER_HEADER", "MCP_PATH", "SESSION_TOKEN_HEADER", "EpisodeRunner", "McpEpisode",
           "ToolReply", "new_token"]

MCP_PATH = "/mcp"
"""Where a server serves MCP."""

SESSION_TOKEN_HEADER = "X-NeMo-Gym-Session-Token"
"""The header naming an episode in an MCP request (NeMo Gym 0.7's name)."""

INNER_HEADER = "x-nemo-gym-mcp-inner"
"""Marks the requests an :class:`EpisodeRunner` sends to its own app (they get no MCP metadata)."""


def new_token() -> str:
    """An episode's token: unguessable, so holding it is what makes an episode one's own."""
    return secrets.token_urlsafe(24)


@dataclass
class McpEpisode:
    """One episode: its task row, its cookies (the resources session), and the items so far.

    Attributes:
        token: The episode's key (``X-NeMo-Gym-Session-Token``); unguessable.
        row: The task row it was seeded with.
        task_index: The row's index in the server's task list, when it was named by index.
        client: The HTTP client holding the episode's cookie jar (to the app, in process).
        items: ``function_call`` and ``function_call_output`` items, in the order they happened.
        step_rewards: The step reward of each tool call that gave one.
    """

    token: str
    row: dict[str, Any]
    task_index: int | None
    client: httpx.AsyncClient
    items: list[dict[str, Any]] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    nbytes: int = 0
    """Bytes of the recorded arguments and outputs (bounded by the runner's ``max_trajectory_bytes``)."""
    observation: str | None = None
    """A Gymnasium-protocol episode's latest observation (the first: ``/reset``'s)."""
    ended: bool = False
    """A Gymnasium-protocol episode that its server ended (terminated or truncated)."""


@dataclass(frozen=True)
class ToolReply:
    """A tool route's reply: the body (what the model reads), its status, its step reward."""

    text: str
    status: int
    step_reward: float | None
    step: dict[str, Any] | None = None
    """A Gymnasium-protocol server's whole ``/step`` reply (its reward, flags, info)."""


class EpisodeRunner:
    """Plays episodes against ``app`` in process; see the module docstring.

    Args:
        app: The resources server's complete ASGI app.
        label: The server, for messages.
        call_timeout_s: The longest a seed, a tool call or a close may take.
        verify_timeout_s: The longest ``/verify`` may take.
        max_trajectory_bytes: The most an episode's recorded arguments and outputs may hold (see the module
            docstring); keep it under the server's body limit, which the ``/verify`` body must fit.
    """

    def __init__(self, app: Any, label: str, *, call_timeout_s: float = 60.0, verify_timeout_s: float = 300.0,
                 max_trajectory_bytes: int = 16 * 1024 * 1024, gymnasium: bool = False):
        self.gymnasium = gymnasium
        self.transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        self.label = label
        self.call_timeout_s = call_timeout_s
        self.verify_timeout_s = verify_timeout_s
        self.max_trajectory_bytes = max_trajectory_bytes

    def new_client(self) -> httpx.AsyncClient:
        """A client with an empty cookie jar, on the shared in-process transport."""
        return httpx.AsyncClient(transport=self.transport, base_url="http://localhost",  # a name every server answers to
                                 headers={INNER_HEADER: "1"})

    async def _post(self, client: httpx.AsyncClient, route: str, content: bytes, timeout_s: float) -> httpx.Response:
        try:
            return await asyncio.wait_for(
                client.post(route, content=content, headers={"content-type": "application/json"}), timeout_s)
        except TimeoutError:
            raise McpError(f"{self.label}: POST {route} did not answer within {timeout_s:g} s",
                           timed_out=True) from None

    async def seed(self, row: dict[str, Any], task_index: int | None) -> McpEpisode:
        """``POST /seed_session`` with the row, in a new session.

        Raises:
            McpError: the server refused the row or did not answer in time.
        """
        episode = McpEpisode(new_token(), row, task_index, self.new_client())
        route = "/reset" if self.gymnasium else "/seed_session"
        reply = await self._post(episode.client, route, json.dumps(row).encode(), self.call_timeout_s)
        if reply.status_code >= 400:
            await episode.client.aclose()
            raise McpError(f"{self.label}: POST {route} answered {reply.status_code}: {reply.text[:500]}")
        if self.gymnasium:
            episode.observation = _json(reply).get("observation")
        return episode

    async def call(self, episode: McpEpisode, name: str, arguments: dict[str, Any]) -> ToolReply:
        """``POST /<name>`` in the episode's session; the reply, even a 4xx/5xx, is the tool's output.

        The call and its output join the episode's items as the env records them.
        """
        text = json.dumps(arguments, ensure_ascii=False)
        cap = self.max_trajectory_bytes
        async with episode.lock:
            size = len(text.encode())
            if episode.nbytes + size > cap:
                raise McpError(f"{self.label}: this call's arguments ({size:,} bytes) would take the episode's "
                               f"trajectory past its cap of {_mib(cap)} ({episode.nbytes:,} bytes recorded); "
                               "nothing was called: end the episode with verify")
            call_id = new_id("call")
            call = {"type": "function_call", "call_id": call_id, "name": name, "arguments": text,
                    "id": new_id("fc"), "status": "completed"}
            step = None
            if self.gymnasium:
                reply, step = await self._step(episode, call)
                outputs = [out for out in (step.get("info") or {}).get("tool_outputs") or []
                           if isinstance(out, dict) and out.get("call_id") == call_id]
                output = str(outputs[0].get("output")) if outputs else json.dumps(
                    {k: step.get(k) for k in ("observation", "reward", "terminated", "truncated")})
            else:
                reply = await self._post(episode.client, f"/{name}", text.encode(), self.call_timeout_s)
                output = reply.text
            room = cap - episode.nbytes - size
            if len(output.encode()) > room:
                note = f"\n[cut: the episode's trajectory reached its cap of {_mib(cap)}; end it with verify]"
                keep = max(0, room - len(note.encode()))
                output = output.encode()[:keep].decode("utf-8", "ignore") + note
            episode.items.append(call)
            episode.items.append({"type": "function_call_output", "call_id": call_id, "output": output})
            episode.nbytes += size + len(output.encode())
            step_reward = step["reward"] if step is not None else _step_reward(reply)
            if step_reward is not None:
                episode.step_rewards.append(step_reward)
            return ToolReply(output, reply.status_code, step_reward, step)

    async def say(self, episode: McpEpisode, text: str) -> dict[str, Any]:
        """A Gymnasium-protocol episode's turn that is a message (to a conversational server's user):
        ``POST /step``; returns the reply (the next observation, the step's reward, the flags).

        Raises:
            McpError: the server answered an error (a failed user model: 502), or not in time.
        """
        async with episode.lock:
            size = len(text.encode())
            if episode.nbytes + size > self.max_trajectory_bytes:
                raise McpError(f"{self.label}: this message ({size:,} bytes) would take the episode's trajectory "
                               f"past its cap of {_mib(self.max_trajectory_bytes)}; nothing was sent")
            message = {"type": "message", "role": "assistant", "id": new_id("msg"), "status": "completed",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]}
            _, step = await self._step(episode, message)
            episode.items.append(message)
            episode.nbytes += size
            episode.step_rewards.append(step["reward"])
            return step

    async def _step(self, episode: McpEpisode, item: dict[str, Any]) -> tuple[httpx.Response, dict[str, Any]]:
        if episode.ended:
            raise McpError(f"{self.label}: this episode has ended")
        tools = list(episode.row.get("responses_create_params", {}).get("tools") or [])
        response = make_response([item], tools=tools).model_dump(mode="json", exclude_none=True)
        body = json.dumps({**episode.row, "response": response}, ensure_ascii=False).encode()
        reply = await self._post(episode.client, "/step", body, self.call_timeout_s)
        step = _json(reply)
        reward = step.get("reward")
        if reply.status_code >= 400 or isinstance(reward, bool) or not isinstance(reward, (int, float)):
            episode.ended = reply.status_code >= 500  # the server failed the step (its user model, say): no going on
            raise McpError(f"{self.label}: POST /step answered {reply.status_code}: {reply.text[:500]}")
        episode.observation = step.get("observation")
        episode.ended = bool(step.get("terminated") or step.get("truncated"))
        return reply, step

    def verify_body(self, episode: McpEpisode, answer: str) -> dict[str, Any]:
        """The ``/verify`` body of the episode ended by ``answer``: the row plus the whole episode."""
        final = {"type": "message", "role": "assistant", "id": new_id("msg"), "status": "completed",
                 "content": [{"type": "output_text", "text": answer, "annotations": []}]}
        tools = list(episode.row.get("responses_create_params", {}).get("tools") or [])
        response = make_response([*episode.items, final], tools=tools)
        return {**episode.row, "response": response.model_dump(mode="json", exclude_none=True)}

    async def verify(self, episode: McpEpisode, answer: str) -> dict[str, Any]:
        """``POST /verify`` with the episode ended by ``answer``; returns the reply (with ``reward``).

        Raises:
            McpError: the server answered an error, a reply without a numeric reward, or nothing in time.
        """
        async with episode.lock:
            body = json.dumps(self.verify_body(episode, answer), ensure_ascii=False).encode()
            reply = await self._post(episode.client, "/verify", body, self.verify_timeout_s)
        verdict = _json(reply)
        reward = verdict.get("reward")
        if reply.status_code >= 400 or isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise McpError(f"{self.label}: POST /verify answered {reply.status_code}: {reply.text[:500]}")
        return verdict

    async def close(self, episode: McpEpisode, *, release: bool = True) -> None:
        """End the episode: ``POST /close_session`` (when ``release``; a failure there is not the caller's)."""
        try:
            if release and not self.gymnasium:  # a Gymnasium-protocol server frees an episode's state when it ends
                await self._post(episode.client, "/close_session", b"{}", self.call_timeout_s)
        except McpError:
            pass
        finally:
            await episode.client.aclose()


def _json(reply: httpx.Response) -> dict[str, Any]:
    try:
        body = reply.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _mib(size: int) -> str:
    return f"{size:,} bytes ({size / 2**20:.2f} MiB)"


def _step_reward(reply: httpx.Response) -> float | None:
    values = reply.headers.get_list(STEP_REWARD_HEADER)
    if len(values) != 1:
        return None
    try:
        return float(values[0])
    except ValueError:
        return None
