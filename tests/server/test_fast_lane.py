"""The fast lane (server/fast_lane.py) answers exactly as FastAPI's full stack: the same requests, good and bad,
sent to a server's app with the lane and to the same server's app without it, get the same replies (status,
headers, body byte for byte; the session cookies alike but for the session id they carry). The lane takes only
what it can answer that way; the rest goes through the stack."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel

from nemo_gym_env.protocol.types import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym_env.server.base import SimpleResourcesServer, set_step_reward
from nemo_gym_env.server.fast_lane import ServerApp
from nemo_gym_env.system.child_env import SESSION_SECRET_ENV

CLIENT = ("127.0.0.1", 50000)  # a loopback address, so the host check runs as for a real client


class Note(BaseModel):
    text: str
    times: int = 1


class Noted(BaseModel):
    echo: str
    session_notes: int


class LaneServer(SimpleResourcesServer):
    """Routes of every kind the lane meets: stateful, step rewards, errors, a Response returned, bad replies."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/note")(self.note)
        app.post("/rewarded")(self.rewarded)
        app.post("/fails")(self.fails)
        app.post("/refuses")(self.refuses)
        app.post("/raw")(self.raw)
        app.post("/wrong_reply")(self.wrong_reply)
        app.post("/optional")(self.optional)
        app.post("/with_query")(self.with_query)
        app.post("/with_dependency")(self.with_dependency)
        return app

    async def note(self, request: Request, body: Note) -> Noted:
        session_id = self.session_id(request)
        self.sessions[session_id] = self.sessions.get(session_id, 0) + body.times
        return Noted(echo=body.text * body.times, session_notes=self.sessions[session_id])

    async def rewarded(self, body: Note, response: Response) -> Noted:
        set_step_reward(response, 0.25)
        response.headers["x-extra"] = body.text
        if body.times == 7:
            response.status_code = 202
        return Noted(echo=body.text, session_notes=0)

    async def fails(self, body: Note) -> Noted:
        raise ValueError(f"no {body.text}")

    async def refuses(self, body: Note) -> Noted:
        raise HTTPException(status_code=418, detail=f"teapot {body.text}")

    async def raw(self, body: Note) -> Noted:
        return JSONResponse({"raw": body.text}, status_code=201, headers={"x-raw": "1"})  # type: ignore[return-value]

    async def wrong_reply(self, body: Note) -> Noted:
        return {"echo": body.text}  # type: ignore[return-value]  # session_notes missing: a 500

    async def optional(self, body: Note | None = None) -> Noted:
        return Noted(echo=body.text if body else "none", session_notes=0)

    async def with_query(self, body: Note, q: int = 0) -> Noted:
        return Noted(echo=body.text, session_notes=q)

    async def with_dependency(self, body: Note, extra: str = Depends(lambda: "dep")) -> Noted:
        return Noted(echo=body.text + extra, session_notes=0)

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        if body.model_extra and body.model_extra.get("boom"):
            raise RuntimeError("verifier bug")
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


def _apps(monkeypatch: pytest.MonkeyPatch, **config: Any) -> tuple[ServerApp, ServerApp]:
    monkeypatch.setenv(SESSION_SECRET_ENV, "one secret for both apps")
    lane = LaneServer.from_config(config, name="lane").build_app()
    stack = LaneServer.from_config(config, name="lane").build_app()
    stack.fast_lane = False
    return lane, stack


def _reply(reply: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = []
    for key, value in reply.headers.multi_items():
        if key == "set-cookie":  # the same cookie but for the session it names
            name, _, rest = value.partition("=")
            payload, _, attributes = rest.partition(";")
            value = f"{name}=<{'null' if payload == 'null' else 'session'}>;{attributes}"
        headers.append((key, value))
    return reply.status_code, headers, reply.content


ROW = {"responses_create_params": {"input": "hi"}}
VERIFY = {**ROW, "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [],
                              "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}}
# (path, body as bytes or JSON, headers): sent in order, on one client (one session) per app.
CASES: list[tuple[str, Any, dict[str, str]]] = [
    ("/seed_session", ROW, {}),
    ("/note", {"text": "a", "times": 2}, {}),
    ("/note", {"text": "b"}, {"content-type": "application/json"}),
    ("/note", b'{"text": "b", "text": "c"}', {"content-type": "application/json"}),  # the last key wins
    ("/note", {"text": "ü\u2028\U0001f600", "extra": [1, {"x": None}]}, {}),
    ("/note", b'{"text": 5}', {}),  # 422
    ("/note", b'{"text": "x"', {}),  # not JSON: 422
    ("/note", b"", {}),
    ("/note", b"null", {}),
    ("/note", b'"text"', {}),
    ("/note", b'{"text": "x"}', {"content-type": "text/plain"}),
    ("/note", b'{"text": "x"}', {"content-type": ""}),  # none: JSON or not, as FastAPI's release decides
    ("/note", b'{"text": "x"}', {"content-type": "application/json; charset=utf-8"}),
    ("/note", b'{"text": "x"}', {"content-type": "application/vnd.api+json"}),
    ("/note", b'{"text": NaN}', {}),
    ("/note", b"[" * 5000 + b"]" * 5000, {}),  # nested too deeply
    ("/note", b'{"text": "\\ud800"}', {}),
    ("/note", {"text": "x" * 3000}, {}),  # over the test's body limit: 413
    ("/note", {"text": "h"}, {"host": "evil.example"}),  # 421
    ("/note", {"text": "o"}, {"origin": "http://evil.example"}),  # 403
    ("/rewarded", {"text": "r"}, {}),
    ("/rewarded", {"text": "r", "times": 7}, {}),
    ("/fails", {"text": "x"}, {}),
    ("/refuses", {"text": "x"}, {}),
    ("/raw", {"text": "x"}, {}),
    ("/wrong_reply", {"text": "x"}, {}),
    ("/optional", {"text": "x"}, {}),
    ("/optional", b"", {}),
    ("/optional", b"null", {}),
    ("/with_query?q=3", {"text": "x"}, {}),
    ("/with_dependency", {"text": "x"}, {}),
    ("/verify", {**VERIFY, "response": {"output": "not a list"}}, {}),  # 422
    ("/verify", {**VERIFY, "boom": True}, {}),  # the verifier raises: reward 0 with the reason
    ("/note", {"text": "after verify"}, {}),  # the session was released: counts restart
    ("/verify", {**VERIFY, "note": "\ud800"}, {}),  # an echo that cannot be encoded: 400
    ("/verify", VERIFY, {}),
    ("/close_session", {}, {}),
    ("/aggregate_metrics", {"verify_responses": [{"reward": 1.0}]}, {}),
    ("/seed_session", {"resources_session_id": "s1", "episode_id": {"rollout_id": "r"},
                       "task_id": {"taskset": "t", "task_id": "1"}, "task_data": ROW}, {}),  # NeMo Gym 0.7's typed seed
    ("/seed_session", {"resources_session_id": "s1", "task_data": ROW}, {}),  # a malformed typed seed: 422
]


def _send(client: TestClient, path: str, body: Any, headers: dict[str, str]) -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {key: value for key, value in {"content-type": "application/json", **headers}.items() if value}
    return client.post(path, content=content, headers=headers)


def test_the_lane_answers_every_request_as_the_full_stack(monkeypatch):
    lane, stack = _apps(monkeypatch, max_body_bytes=2048)
    with TestClient(lane, client=CLIENT, base_url="http://127.0.0.1") as fast, \
            TestClient(stack, client=CLIENT, base_url="http://127.0.0.1") as slow:
        for path, body, headers in CASES:
            got, want = _reply(_send(fast, path, body, headers)), _reply(_send(slow, path, body, headers))
            if path == "/wrong_reply":  # FastAPI's recent releases add the endpoint's source line to the error
                assert got[0] == want[0] == 500
                got, want = json.loads(got[2])["error"], json.loads(want[2])["error"]
                assert want.startswith(got.split(" File ")[0].rstrip()), (got, want)
                continue
            assert got == want, (path, body if isinstance(body, bytes) else json.dumps(body)[:200], headers)
    assert lane.lane().answered == 18  # the 22 others failed one of its checks and met the stack
    taken = set(lane.lane().routes)
    assert {"/seed_session", "/verify", "/note", "/rewarded", "/fails", "/refuses", "/raw", "/wrong_reply",
            "/optional", "/aggregate_metrics"} <= taken
    assert not taken & {"/with_query", "/with_dependency", "/close_session"}
    assert stack.lane() is None


def test_a_lost_or_forged_session_meets_the_stack(monkeypatch):
    lane, stack = _apps(monkeypatch)
    for app in (lane, stack):
        with TestClient(app, client=CLIENT, base_url="http://127.0.0.1") as client:
            cookie_name = next(iter(client.post("/seed_session", json=ROW).cookies))
            client.cookies.clear()
            forged = {"cookie": f"{cookie_name}=forged.value.sig"}
            reply = client.post("/note", json={"text": "x"}, headers=forged)
            assert reply.status_code == 410, reply.text
            assert "set-cookie" not in reply.headers
            assert client.post("/rewarded", json={"text": "x"}, headers=forged).status_code == 200  # no session asked
            assert client.post("/seed_session", json=ROW).status_code == 200  # a new seed starts a new session
            assert client.post("/note", json={"text": "x"}).json()["session_notes"] == 1


def test_a_middleware_of_the_servers_own_turns_the_lane_off(monkeypatch):
    seen = []

    class Counting:
        def __init__(self, app: Any):
            self.app = app

        async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])
            await self.app(scope, receive, send)

    class WithMiddleware(LaneServer):
        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()
            app.add_middleware(Counting)
            return app

    app = WithMiddleware.from_config({}, name="counted").build_app()
    with TestClient(app, client=CLIENT, base_url="http://127.0.0.1") as client:
        assert client.post("/note", json={"text": "x"}).status_code == 200
    assert app.lane() is None
    assert seen == ["/note"]


def test_a_route_registered_first_keeps_its_path(monkeypatch):
    class Shadowed(LaneServer):
        def setup_webserver(self) -> FastAPI:
            app = ServerApp()
            app.post("/no{anything}")(self.any_route)
            base = super().setup_webserver()
            app.router.routes.extend(base.router.routes)
            app.user_middleware = base.user_middleware
            return app

        async def any_route(self, anything: str) -> dict[str, str]:
            return {"caught": anything}

    app = Shadowed.from_config({}, name="shadowed").build_app()
    with TestClient(app, client=CLIENT, base_url="http://127.0.0.1") as client:
        assert client.post("/note", json={"text": "x"}).json() == {"caught": "te"}
        assert client.post("/seed_session", json=ROW).json() == {}
    assert "/note" not in app.lane().routes and "/seed_session" in app.lane().routes
