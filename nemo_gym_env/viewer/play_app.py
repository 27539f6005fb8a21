"""The play page's web app: a person plays one episode of an environment by hand.

Each page session holds its own :class:`~nemo_gym_env.envs.env.NemoGymEnv`, made by ``gym.make``
exactly as a training script makes it, so the page shows what a policy gets: the task's
input items, the tools of ``info["tools"]``, each call's ``function_call_output`` and, at the
end, the reward and the ``/verify`` reply. A turn the person plays becomes Responses output
items (:mod:`nemo_gym_env.protocol.scripting` builds them as the scripted players do).

Routes (JSON; errors are ``{"error": message}``):

- ``GET /`` the page; ``GET /static/<name>`` its scripts and style
- ``GET /api/info`` the server, its tasks (index and a preview), the output file
- ``POST /api/sessions`` ``{"task_index": int | null, "seed": int | null}`` -> a new episode: session
  id, task index, observation, tools
- ``POST /api/sessions/{id}/step`` ``{"calls": [{"name", "arguments"}], "message": str | null}`` -> what
  ``env.step`` returned, and the verify reply once the episode is over
- ``POST /api/sessions/{id}/save`` the finished episode appended to the output as a rollout row
- ``DELETE /api/sessions/{id}`` closes the session's env

Example:
    >>> plays = PlaySessions(EnvSpec("NemoGym/example_single_tool_call-v0"), "results/played.jsonl")  # doctest: +SKIP
    >>> app = create_play_app(plays, Scrubber())                                                    # doctest: +SKIP
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from nemo_gym_env.errors import ActionError, PageRequestError, RolloutFileError
from nemo_gym_env.protocol.dataset import input_items
from nemo_gym_env.protocol.scripting import assistant_message, function_call
from nemo_gym_env.rollouts.identity import server_of, stamp, task_keys
from nemo_gym_env.rollouts.output import RolloutWriter
from nemo_gym_env.viewer.rows import Scrubber
from nemo_gym_env.viewer.web import json_reply, page_app

__all__ = ["EnvSpec", "PlaySessions", "create_play_app"]

MAX_SESSIONS = 16
"""Episodes held at once; the least recently used one is closed to make room."""

SESSION_IDLE_S = 3600.0
"""An episode untouched this long is closed when another starts."""

_PREVIEW_CHARS = 160


@dataclass(frozen=True)
class EnvSpec:
    """What ``gym.make`` is called with for each episode.

    Attributes:
        env_id: ``NemoGym/<server>-v0`` or ``NemoGym/Generic-v0``.
        kwargs: Its keyword arguments (``dataset``, ``base_url``, ``config_paths``, ``max_steps``...).
    """

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def make(self) -> gym.Env:
        """A new env."""
        return gym.make(self.env_id, **self.kwargs)


@dataclass
class _Session:
    env: gym.Env
    lock: threading.Lock = field(default_factory=threading.Lock)
    used: float = field(default_factory=time.monotonic)
    turn: int = 0
    saved: dict[str, Any] | None = None


def _preview(row: dict[str, Any]) -> str:
    """The task's last user message, shortened: what tells tasks apart in the picker."""
    for item in reversed(input_items(row)):
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, list):
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            return str(content)[:_PREVIEW_CHARS]
    return ""


class PlaySessions:
    """Episodes played from the page, one env each; the first env is kept open for the server's life.

    The first env (made here) starts the server when ``gym.make`` launches it, and holding it
    keeps that process up between episodes instead of starting one per episode.

    Args:
        spec: How to make each episode's env.
        output: Where saved episodes are appended (a rollouts JSONL).
    """

    def __init__(self, spec: EnvSpec, output: str | Path):
        self.spec = spec
        self.output = Path(output)
        self.anchor = spec.make()
        self.rows: list[dict[str, Any]] = self.anchor.unwrapped.rows
        self.task_keys = task_keys(self.rows)
        self.server = self.anchor.unwrapped.server_name
        self.max_steps = self.anchor.unwrapped.max_steps
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()

    def start(self, task_index: int | None, seed: int | None) -> tuple[str, _Session, list, dict]:
        """A new episode: ``(session id, session, observation, info)``."""
        if task_index is not None and not 0 <= task_index < len(self.rows):
            raise PageRequestError(422, f"task_index: there are {len(self.rows)} tasks (0 to {len(self.rows) - 1}), not {task_index}")
        self._evict()
        env = self.spec.make()
        session = _Session(env)
        try:
            observation, info = env.reset(seed=seed, options=None if task_index is None else {"task_index": task_index})
        except Exception as exc:
            env.close()
            raise PageRequestError(502, f"the server could not start the episode: {exc}") from None
        session_id = secrets.token_urlsafe(16)
        with self._lock:
            self._sessions[session_id] = session
        return session_id, session, observation, info

    def get(self, session_id: str) -> _Session:
        """The live session; 404 when it never was or has been closed."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise PageRequestError(404, "no such episode (closed, or the play server restarted): start a new one")
            self._sessions.move_to_end(session_id)
            session.used = time.monotonic()
            return session

    def _evict(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [sid for sid, s in self._sessions.items() if now - s.used > SESSION_IDLE_S]
            while len(self._sessions) - len(stale) >= MAX_SESSIONS:
                stale.append(next(sid for sid in self._sessions if sid not in stale))
            closing = [self._sessions.pop(sid) for sid in stale]
        for session in closing:
            session.env.close()

    def close(self, session_id: str | None = None) -> None:
        """Close one session, or every session and the first env."""
        with self._lock:
            ids = list(self._sessions) if session_id is None else [session_id]
            closing = [self._sessions.pop(sid) for sid in ids if sid in self._sessions]
        for session in closing:
            session.env.close()
        if session_id is None:
            self.anchor.close()

    def step(self, session: _Session, calls: list[dict[str, Any]], message: str | None) -> dict[str, Any]:
        """Play one turn: the calls (in order) and the message, as one model turn."""
        with session.lock:
            items = [function_call(session.turn, i, call["name"], call["arguments"]) for i, call in enumerate(calls)]
            if message is not None:
                items.append(assistant_message(message, f"msg_t{session.turn}"))
            try:
                observation, reward, terminated, truncated, info = session.env.step(items)
            except gym.error.ResetNeeded:
                raise PageRequestError(409, "this episode is over: start a new one") from None
            except ActionError as exc:
                raise PageRequestError(422, f"not a valid turn: {exc}") from None
            session.turn += 1
            verify = session.env.unwrapped.last_verify if terminated or truncated else None
            return {"items": items, "observation": observation, "reward": reward, "terminated": terminated,
                    "truncated": truncated, "info": info, "verify": verify, "turn": session.turn}

    def save(self, session: _Session) -> dict[str, Any]:
        """Append the finished episode to the output as a rollout row (once; again returns where it went)."""
        with session.lock:
            if session.saved is not None:
                return session.saved
            env = session.env.unwrapped
            if env.last_verify is None or env.episode is None or not env.episode.done:
                raise PageRequestError(409, "finish the episode first (a final answer, or the step limit): then it has a reward")
            task_index = env.episode.task_index
            with self._save_lock:
                try:
                    with RolloutWriter(self.output, resume=True) as writer:
                        # The episode's verdict, as the rollouts command writes it (step rewards included).
                        row = env.episode.verdict() or dict(env.last_verify)
                        ref = row.get("agent_ref") or {"type": "resources_servers", "name": self.server}
                        server, key, rollout = server_of({"agent_ref": ref}) or "", self.task_keys[task_index], 0
                        while writer.is_done(server, key, task_index, rollout):
                            rollout += 1
                        stamp(row, task_index=task_index, key=key, rollout_index=rollout, agent_ref=ref)
                        writer.write(row)
                except (RolloutFileError, OSError) as exc:
                    raise PageRequestError(409, f"cannot append to {self.output}: {exc}") from None
            session.saved = {"path": str(self.output), "task_index": task_index, "rollout_index": rollout}
            return session.saved


class _NewEpisode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_index: int | None = None
    seed: int | None = Field(None, ge=0)


class _Call(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] | str  # a string goes as typed, as a model's unparseable arguments would


class _Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    calls: list[_Call] = Field(default_factory=list, max_length=64)
    message: str | None = None


def create_play_app(plays: PlaySessions, scrubber: Scrubber, *, bind_host: str = "127.0.0.1") -> FastAPI:
    """The play app over ``plays``; every string out through ``scrubber``."""
    app = page_app("nemo-gym-env play", page="play.html", scrubber=scrubber, bind_host=bind_host)

    def safe(content: Any) -> JSONResponse:
        return json_reply(content, scrubber)

    @app.get("/api/info")
    def info() -> JSONResponse:
        tasks = [{"index": i, "preview": _preview(row)} for i, row in enumerate(plays.rows[:1000])]
        return safe({"server": plays.server, "num_tasks": len(plays.rows), "tasks": tasks,
                     "output": str(plays.output), "max_steps": plays.max_steps})

    @app.post("/api/sessions")
    def new_episode(body: _NewEpisode) -> JSONResponse:
        session_id, session, observation, info = plays.start(body.task_index, body.seed)
        return safe({"session": session_id, "task_index": info["task_index"], "observation": observation,
                     "tools": info["tools"], "sampling": info["sampling"], "server": plays.server,
                     "max_steps": plays.max_steps})

    @app.post("/api/sessions/{session_id}/step")
    def step(session_id: str, body: _Turn) -> JSONResponse:
        if not body.calls and body.message is None:
            raise PageRequestError(422, "a turn needs a tool call or a final answer")
        session = plays.get(session_id)
        return safe(plays.step(session, [call.model_dump() for call in body.calls], body.message))

    @app.post("/api/sessions/{session_id}/save")
    def save(session_id: str) -> JSONResponse:
        return safe(plays.save(plays.get(session_id)))

    @app.delete("/api/sessions/{session_id}")
    def close(session_id: str) -> JSONResponse:
        plays.get(session_id)
        plays.close(session_id)
        return safe({"closed": True})

    return app
