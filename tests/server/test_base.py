"""The resources server base: sessions, cookies, errors, limits, metrics (in-process app)."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from itsdangerous import TimestampSigner
from pydantic import BaseModel

from nemo_gym_env.protocol.types import BaseVerifyRequest, BaseVerifyResponse, make_response
from nemo_gym_env.server import SESSION_ID_KEY, BaseResourcesServerConfig, SimpleResourcesServer

ROW = {"responses_create_params": {"input": "count"}, "expected": 3}
RESPONSE = make_response([]).model_dump(mode="json")


class AddRequest(BaseModel):
    count: int


class CounterServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/add")(self.add)
        app.post("/explode")(self.explode)
        return app

    async def add(self, body: AddRequest, request: Request) -> dict:
        sid = self.session_id(request)
        self.sessions[sid] = self.sessions.get(sid, 0) + body.count
        return {"count": self.sessions[sid]}

    async def explode(self) -> dict:
        raise RuntimeError("tool bug")

    async def verify(self, request: Request, body: BaseVerifyRequest) -> BaseVerifyResponse:
        mode = body.model_extra.get("mode")
        if mode == "raise":
            raise ValueError("verifier bug")
        if mode == "nan":
            return BaseVerifyResponse(**body.model_dump(), reward=float("nan"))
        value = self.sessions.get(self.session_id(request))
        return BaseVerifyResponse(**body.model_dump(), reward=float(value == body.model_extra["expected"]))


@pytest.fixture
def server() -> CounterServer:
    return CounterServer.from_config({"max_body_bytes": 4096}, name="counter")


@pytest.fixture
def client(server) -> TestClient:
    with TestClient(server.build_app()) as c:
        yield c


def test_liveness(client):
    assert client.get("/").json() == {"status": "ok"}


def test_session_cookie_named_like_nemo_gym_and_state_is_per_session(server, client):
    reply = client.post("/seed_session", json=ROW)
    assert reply.status_code == 200 and reply.json() == {}
    assert list(reply.cookies) == ["CounterServer___counter"]
    client.post("/add", json={"count": 1})
    assert client.post("/add", json={"count": 2}).json() == {"count": 3}
    with TestClient(server.build_app()) as other:  # same server object, new cookie jar
        other.post("/seed_session", json=ROW)
        assert other.post("/add", json={"count": 1}).json() == {"count": 1}
    assert client.post("/verify", json={**ROW, "response": RESPONSE}).json()["reward"] == 1.0


def test_verify_frees_the_session(server, client):
    client.post("/add", json={"count": 3})
    assert len(server.sessions) == 1
    client.post("/verify", json={**ROW, "response": RESPONSE})
    assert len(server.sessions) == 0


def test_forged_cookies_reach_no_state(server, client):
    client.post("/add", json={"count": 3})
    victim = next(iter(server.sessions))
    payload = __import__("base64").b64encode(json.dumps({SESSION_ID_KEY: victim}).encode())
    # NeMo Gym signs with "<ClassName>___<name>"; ours is random per launch, so that forgery fails.
    for secret in ("CounterServer___counter", "", "secret"):
        forged = TimestampSigner(secret or "x").sign(payload).decode()
        with TestClient(server.build_app(), cookies={"CounterServer___counter": forged}) as attacker:
            refused = attacker.post("/add", json={"count": 100})
            assert refused.status_code == 410 and "session" in refused.json()["error"]
    assert dict(server.sessions) == {victim: 3}


def test_a_cookie_from_another_launch_is_refused(server, client):
    client.post("/add", json={"count": 3})
    cookie = client.cookies["CounterServer___counter"]
    relaunched = CounterServer.from_config({}, name="counter")  # same class and name, new secret
    with TestClient(relaunched.build_app(), cookies={"CounterServer___counter": cookie}) as replay:
        refused = replay.post("/add", json={"count": 1})
        assert refused.status_code == 410 and "set-cookie" not in refused.headers
        assert len(relaunched.sessions) == 0
        # A route that keeps no state still answers, and /seed_session starts a new session.
        assert replay.get("/").status_code == 200
        assert replay.post("/seed_session", json=ROW).status_code == 200
        assert replay.post("/add", json={"count": 1}).json() == {"count": 1}


def test_session_ids_are_random_uuids(server):
    for _ in range(50):
        with TestClient(server.build_app()) as c:
            c.post("/add", json={"count": 1})
    ids = set(server.sessions)
    assert len(ids) == 50 and all(len(i) == 36 for i in ids)


def test_bad_bodies_get_4xx_naming_route_and_field(client):
    reply = client.post("/add", json={"count": "many"})
    assert reply.status_code == 422 and "POST /add" in reply.json()["error"] and "count" in reply.json()["error"]
    assert client.post("/add", content=b"{not json", headers={"content-type": "application/json"}).status_code == 422
    assert client.post("/add", json=[1, 2]).status_code == 422
    reply = client.post("/verify", json={"responses_create_params": {"input": "x", "temperature": "hot"},
                                         "response": RESPONSE})
    assert reply.status_code == 422 and "temperature" in reply.json()["error"]  # a field we read is checked
    # A key we do not read (a newer client's) is kept and passed on, not refused.
    reply = client.post("/verify", json={"responses_create_params": {"input": "x", "prompt_cache_key": None,
                                                                     "typo": 1}, "response": RESPONSE})
    assert reply.status_code == 200
    assert reply.json()["responses_create_params"]["typo"] == 1
    assert client.post("/verify", json=ROW).status_code == 422  # no response
    assert client.post("/no_such_tool", json={}).status_code == 404


def test_tool_exception_is_a_500_with_a_message(server):
    with TestClient(server.build_app(), raise_server_exceptions=False) as client:
        reply = client.post("/explode", json={})
    assert reply.status_code == 500 and "tool bug" in reply.json()["error"]


def test_raising_or_nan_verifier_gives_zero_with_reason(client):
    reply = client.post("/verify", json={**ROW, "response": RESPONSE, "mode": "raise"})
    assert reply.status_code == 200
    body = reply.json()
    assert body["reward"] == 0.0 and body["failure_kind"] == "verifier_error" and "verifier bug" in body["failure_reason"]
    assert body["expected"] == 3  # the row is echoed back
    reply = client.post("/verify", json={**ROW, "response": RESPONSE, "mode": "nan"})
    assert reply.json()["reward"] == 0.0 and reply.json()["failure_kind"] == "invalid_reward"


def test_oversized_bodies_are_refused_with_413(client):
    assert client.post("/add", content=b"x" * 5000, headers={"content-type": "application/json"}).status_code == 413

    def chunks():
        for _ in range(10):
            yield b" " * 1000

    reply = client.post("/add", content=chunks(), headers={"content-type": "application/json"})
    assert reply.status_code == 413


def test_deeply_nested_json_is_a_4xx(client):
    reply = client.post("/add", content=b"[" * 3000 + b"]" * 3000, headers={"content-type": "application/json"})
    assert 400 <= reply.status_code < 500


def test_aggregate_metrics_route(client):
    rows = [{"_ng_task_index": t, "_ng_rollout_index": r, "reward": float(t == 0 and r == 0)}
            for t in range(2) for r in range(2)]
    metrics = client.post("/aggregate_metrics", json={"verify_responses": rows}).json()
    assert metrics["agent_metrics"]["mean/reward"] == 0.25
    assert metrics["agent_metrics"]["pass@2/reward"] == 50.0
    assert len(metrics["group_level_metrics"]) == 2


def test_tool_names(server):
    assert server.tool_names(server.build_app()) == ["add", "explode"]



def test_the_cookie_is_starlettes_and_a_remembered_one_still_expires():
    """The session cookie keeps Starlette's ``SessionMiddleware`` format (Starlette reads ours, we read
    Starlette's), and a cookie that verified once (then answered from memory) is refused once too old."""
    import base64
    import time

    from starlette.applications import Starlette
    from starlette.middleware.sessions import SessionMiddleware
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    name = "CounterServer___counter"
    server = CounterServer.from_config({"session_ttl_s": 1}, name="counter")
    app = server.build_app()

    async def echo(request):
        request.session.setdefault(SESSION_ID_KEY, "set-by-starlette")
        return JSONResponse(dict(request.session))

    theirs = Starlette(routes=[Route("/", echo)])
    theirs.add_middleware(SessionMiddleware, secret_key=server._secret, session_cookie=name, max_age=1)
    with TestClient(app) as ours, TestClient(theirs) as starlette:
        ours_set = ours.post("/seed_session", json=ROW).headers["set-cookie"]
        theirs_set = starlette.get("/").headers["set-cookie"]
        assert ours_set.split(";", 1)[1] == theirs_set.split(";", 1)[1] == " path=/; Max-Age=1; httponly; samesite=lax"
        value = ours.cookies[name]
        carried = json.loads(base64.b64decode(TimestampSigner(server._secret).unsign(value, max_age=1)))
        assert set(carried) == {SESSION_ID_KEY} and len(carried[SESSION_ID_KEY]) == 36
        with TestClient(theirs, cookies={name: value}) as reads_ours:
            assert reads_ours.get("/").json() == carried  # Starlette reads our cookie
        with TestClient(app, cookies={name: starlette.cookies[name]}) as theirs_cookie:
            assert theirs_cookie.post("/add", json={"count": 2}).json() == {"count": 2}  # we read Starlette's
        for _ in range(3):  # the first verifies the signature, the next two are answered from memory
            assert ours.post("/add", json={"count": 1}).status_code == 200
        stale = ours.cookies[name]
        with TestClient(app, cookies={name: stale}) as early:  # now it is remembered
            assert early.post("/add", json={"count": 1}).status_code == 200
        time.sleep(2.2)  # the client's jar drops the cookie at its Max-Age; a client that sends it anyway:
        with TestClient(app, cookies={name: stale}) as late:
            refused = late.post("/add", json={"count": 1})
        assert refused.status_code == 410 and "set-cookie" not in refused.headers


def test_the_cookie_memories_keep_only_the_last_two_seconds():
    from nemo_gym_env.server.middleware import _RecentMemo

    asked = []
    memo = _RecentMemo(lambda key: asked.append(key) or key.upper(), limit=3, keep_previous=True)
    assert [memo("a", 100), memo("a", 100), memo("a", 101)] == ["A", "A", "A"]
    assert asked == ["a"]  # remembered within its second and the next
    assert memo("a", 103) == "A" and asked == ["a", "a"]  # two seconds later: forgotten, computed again
    for key in "bcdef":
        memo(key, 103)
    assert len(memo.current) == 3 and not memo.previous  # at most `limit` a second, the rest computed each time
    memo("b", 104)
    assert len(memo.current) == 1 and len(memo.previous) == 3
    signatures = _RecentMemo(lambda key: asked.append(key) or key, limit=3, keep_previous=False)
    signatures("s", 7), signatures("s", 7), signatures("s", 8)
    assert asked.count("s") == 2  # a signature is never reused in another second
