"""Gymnasium-protocol resources servers: NeMo Gym's ``GymnasiumServer`` contract, hardened.

A server of this kind has no tools and no ``/verify``: the model's whole turn goes to
``POST /step``, which answers the next observation and a reward, as ``gymnasium.Env.step``
does. NeMo Gym's servers written on ``resources_servers.gymnasium.GymnasiumServer`` port by
renaming their imports (``docs/porting.md``)::

    from nemo_gym_env.server.gymnasium import GymnasiumServer, extract_text

    class Echo(GymnasiumServer):
        async def reset(self, metadata, session_id=None):
            return "Say something.", {}

        async def step(self, action, metadata, session_id=None):
            said = extract_text(action)
            return None, float(bool(said)), True, False, {"said": said}

Routes: ``POST /reset`` (body: the task row, ``responses_create_params`` plus its other
fields; reply ``{observation, info}``), ``POST /step`` (body: the row plus ``response``, the
model's turn as a Responses ``Response``; reply ``{observation, reward, terminated, truncated,
info}``), ``POST /aggregate_metrics`` and the liveness routes. The signed session cookie is
the one every server of ours uses. What differs from NeMo Gym, on purpose: per-session state
(``self.session_state``) is the bounded, expiring store of :attr:`sessions`; a ``/step`` of a
session that was never reset, or whose episode has ended, gets ``409`` instead of reaching
``step`` with no state (NeMo Gym's blackjack then plays a hand nobody dealt); a step reply
whose reward is not a finite number is a ``500`` naming it, not a reply a client must guess
about.
"""

from __future__ import annotations

import json
import math
from abc import abstractmethod
from collections import OrderedDict
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, PrivateAttr

from nemo_gym_env.protocol.types import FunctionCall, Response, ResponsesCreateParams
from nemo_gym_env.server.base import SimpleResourcesServer
from nemo_gym_env.server.fast_lane import ServerApp
from nemo_gym_env.server.middleware import SESSION_ID_KEY
from nemo_gym_env.server.sessions import SessionStore

__all__ = ["EnvResetRequest", "EnvResetResponse", "EnvStepRequest", "EnvStepResponse", "GymnasiumServer",
           "extract_text"]


class EnvResetRequest(BaseModel):
    """``POST /reset``: the task row (its other fields reach :meth:`GymnasiumServer.reset` as ``metadata``)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: ResponsesCreateParams


class EnvResetResponse(BaseModel):
    """The first observation (None: the row's input is the whole prompt) and info."""

    observation: str | None = None
    info: dict = {}


class EnvStepRequest(BaseModel):
    """``POST /step``: the task row plus the model's turn."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: ResponsesCreateParams
    response: Response


class EnvStepResponse(BaseModel):
    """What ``gymnasium.Env.step`` returns, as JSON."""

    observation: str | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = {}


def extract_text(response: Response) -> str:
    """Every ``output_text`` of the turn's messages, joined: what a text-action env reads."""
    parts = []
    for item in response.output:
        if getattr(item, "type", None) != "message":
            continue
        content = item.content
        if isinstance(content, str):
            parts.append(content)
            continue
        parts.extend(part.text for part in content if getattr(part, "type", None) == "output_text")
    return "".join(parts)


class GymnasiumServer(SimpleResourcesServer):
    """Base class of Gymnasium-protocol servers: implement :meth:`step`, and :meth:`reset` if needed.

    ``reset(metadata, session_id)`` returns ``(observation or None, info)``;
    ``step(action, metadata, session_id)`` returns ``(observation, reward, terminated,
    truncated, info)``. ``metadata`` holds the row's fields other than
    ``responses_create_params``; ``session_id`` keys per-episode state in
    ``self.session_state``. Tool calls in the turn (``action.output``'s ``function_call``
    items) are answered through ``info["tool_outputs"]`` (:meth:`tool_output` builds one).
    When a step ends the episode, :meth:`close_session` frees its state.
    """

    PROTOCOL: ClassVar[str] = "gymnasium"
    """Read by the launcher's clients: this server speaks ``/reset`` and ``/step``."""

    _episodes: OrderedDict[str, bool] = PrivateAttr(default_factory=OrderedDict)

    @property
    def session_state(self) -> SessionStore[Any]:
        """Per-episode state keyed by session id (NeMo Gym's name for :attr:`sessions`)."""
        return self.sessions

    def setup_webserver(self) -> FastAPI:
        """The app: ``/reset``, ``/step`` and ``/aggregate_metrics`` (no ``/seed_session``, no ``/verify``)."""
        app = ServerApp(title=type(self).__name__, docs_url=None, redoc_url=None)
        self.setup_session_middleware(app)
        app.post("/reset")(self._reset_endpoint)
        app.post("/step")(self._step_endpoint)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        return app

    async def _reset_endpoint(self, body: EnvResetRequest, request: Request) -> EnvResetResponse:
        session_id = request.session.get(SESSION_ID_KEY)
        self._cleanup_session(session_id)  # a reset with the same cookie starts over
        obs, info = await self.reset(body.model_extra or {}, session_id)
        self._remember(session_id, live=True)
        return EnvResetResponse(observation=obs, info=info)

    async def _step_endpoint(self, body: EnvStepRequest, request: Request) -> Any:
        session_id = request.session.get(SESSION_ID_KEY)
        live = self._episodes.get(session_id)
        if not live:
            why = "has ended" if live is False else "was never started"
            return JSONResponse({"error": f"{type(self).__name__}: POST /step: this episode {why}; "
                                          "POST /reset to start one"}, status_code=409)
        obs, reward, terminated, truncated, info = await self.step(body.response, body.model_extra or {},
                                                                   session_id)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"step() returned the reward {reward!r}, not a finite number")
        if terminated or truncated:
            await self.close_session(session_id)
            self._remember(session_id, live=False)
        return EnvStepResponse(observation=obs, reward=reward, terminated=bool(terminated),
                               truncated=bool(truncated), info=info)

    def _remember(self, session_id: str, *, live: bool) -> None:
        self._episodes[session_id] = live
        self._episodes.move_to_end(session_id)
        while len(self._episodes) > self.config.max_sessions:
            self._episodes.popitem(last=False)

    async def reset(self, metadata: dict, session_id: str | None = None) -> tuple[str | None, dict]:
        """Start an episode; the default shows the row's prompt as it is (observation None)."""
        return None, {}

    @abstractmethod
    async def step(self, action: Response, metadata: dict,
                   session_id: str | None = None) -> tuple[str | None, float, bool, bool, dict]:
        """Play the model's turn: ``(observation, reward, terminated, truncated, info)``."""

    async def close_session(self, session_id: str | None) -> None:  # type: ignore[override]
        """Free an ended episode's state (``_cleanup_session``); safe to call more than once."""
        self._cleanup_session(session_id)

    def _cleanup_session(self, session_id: str | None) -> None:
        """Release the state a session owns; override to free structures of your own too."""
        self.session_state.pop(session_id, None)

    @staticmethod
    def tool_output(call: FunctionCall, result: Any) -> dict:
        """The ``info["tool_outputs"]`` entry answering tool call ``call`` with ``result``."""
        return {"call_id": call.call_id, "output": json.dumps(result, default=str)}

    async def verify(self, body: Any) -> Any:  # not routed: a Gymnasium-protocol server scores in /step
        raise NotImplementedError(f"{type(self).__name__} rewards each /step; it has no /verify")
