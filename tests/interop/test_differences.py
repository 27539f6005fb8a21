"""Where our servers differ from NeMo Gym's on purpose, shown on both, side by side.

Each difference only shows to a client that does what no NeMo Gym client does (forge a cookie,
verify a session twice, re-seed a session, verify without seeding) or to a verifier that
raises. Honest clients (NeMo Gym's agent, our Env: a fresh session per episode, one
``/verify`` at its end) get the same tool outputs and rewards from both:
``test_same_rewards.py`` and ``test_their_agent.py``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import gymnasium as gym
import httpx
import itsdangerous
import pytest

import nemo_gym_env  # noqa: F401  (registers the ids)
from nemo_gym_env.protocol.types import make_response

from .conftest import FIXTURE_SERVER, NgStack, our_rows, read_rows, their_rows_path
from .players import call, message

pytestmark = [pytest.mark.interop, pytest.mark.timeout(900)]  # the first test also starts ng_run

SESSION_SERVER = "example_session_state_mgmt"


def _post(url: str, route: str, body: Any, cookie: str | None = None) -> httpx.Response:
    """One request with exactly the cookie given (a fresh client: nothing remembered)."""
    return httpx.post(url + route, json=body, headers={"cookie": cookie} if cookie else {}, timeout=30)


def _cookie(response: httpx.Response) -> str:
    """``name=value`` of the session cookie a reply sets."""
    [header] = response.headers.get_list("set-cookie")
    return header.split(";", 1)[0]


def _session_id(cookie: str) -> str:
    """The session id inside a Starlette session cookie (signed, not encrypted: anyone can read it)."""
    value = cookie.split("=", 1)[1]
    return json.loads(base64.b64decode(value.split(".", 1)[0]))["session_id"]


def _forge(cookie_name: str, session_id: str) -> str:
    """A session cookie signed the way NeMo Gym derives its secret: from the cookie's own name."""
    payload = base64.b64encode(json.dumps({"session_id": session_id}).encode())
    return f"{cookie_name}={itsdangerous.TimestampSigner(cookie_name).sign(payload).decode()}"


def _verify_body(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "response": make_response([message(0, "done")]).model_dump(mode="json", exclude_none=True)}


@pytest.fixture
def session_sides(ng_stack: NgStack, launched: dict[str, str]) -> dict[str, tuple[str, dict]]:
    """side -> (URL of that side's session server, a row it accepts). The row is NeMo Gym's."""
    row = read_rows(their_rows_path(ng_stack.site_packages, SESSION_SERVER))[0]
    return {"theirs": (ng_stack.their_urls[SESSION_SERVER], row), "ours": (launched[SESSION_SERVER], row)}


def test_cookie_secret(session_sides: dict) -> None:
    """Theirs signs cookies with a secret derived from the class and instance name, so a session
    id that leaks (cookies are readable) can be turned into a valid cookie; ours signs with a
    random secret per launch, so a forged cookie is refused (410) and reaches no session."""
    counts = {}
    for side, (url, row) in session_sides.items():
        seeded = _post(url, "/seed_session", row)
        victim = _cookie(seeded)
        name = victim.split("=", 1)[0]
        assert name.startswith("StatefulCounterResourcesServer___")  # same cookie naming on both sides
        assert _post(url, "/increment_counter", {"count": 4}, victim).json() == {"success": True}
        forged = _forge(name, _session_id(victim))
        attacker = _post(url, "/get_counter_value", {}, forged)
        counts[side] = attacker.json()["count"] if attacker.status_code == 200 else attacker.status_code
        assert _post(url, "/get_counter_value", {}, victim).json() == {"count": row["initial_count"] + 4}
    assert counts == {"theirs": session_sides["theirs"][1]["initial_count"] + 4, "ours": 410}


def test_session_state_is_freed_after_verify(session_sides: dict) -> None:
    """Theirs keeps every session's state forever; ours frees it once /verify answered (and
    bounds it by a cap and a TTL). A second /verify of the same session tells the two apart."""
    for side, (url, row) in session_sides.items():
        cookie = _cookie(_post(url, "/seed_session", row))
        _post(url, "/increment_counter", {"count": row["expected_count"] - row["initial_count"]}, cookie)
        first = _post(url, "/verify", _verify_body(row), cookie).json()
        second = _post(url, "/verify", _verify_body(row), cookie).json()
        assert first["reward"] == 1.0, side
        if side == "theirs":
            assert second["reward"] == 1.0 and "failure_reason" not in second
        else:
            assert second["reward"] == 0.0
            assert second["failure_reason"].startswith("no session state")


def test_reseeding_a_session(session_sides: dict) -> None:
    """``/seed_session`` twice in one session: theirs keeps the counter, ours restarts it."""
    for side, (url, row) in session_sides.items():
        cookie = _cookie(_post(url, "/seed_session", row))
        _post(url, "/increment_counter", {"count": 5}, cookie)
        _post(url, "/seed_session", row, cookie)
        count = _post(url, "/get_counter_value", {}, cookie).json()["count"]
        assert count == (row["initial_count"] + 5 if side == "theirs" else row["initial_count"]), side


def test_verify_without_a_session(session_sides: dict) -> None:
    """Verify with no cookie: both give 0; ours also says why."""
    for side, (url, row) in session_sides.items():
        reply = _post(url, "/verify", _verify_body(row)).json()
        assert reply["reward"] == 0.0, side
        assert ("failure_reason" in reply) is (side == "ours")


def test_verifier_exception(ng_stack: NgStack, ported_url: str) -> None:
    """The same verifier code (the port fixture) raising: NeMo Gym answers 500, which ends the
    episode with an error; our base class answers reward 0 with the reason (``verifier_error``),
    which the env reads as no judgement: the episode ends truncated, masked, with the reason."""
    row = {**read_rows(FIXTURE_SERVER / "data" / "example.jsonl")[0], "initial_items": [], "expected_items": []}
    results = {}
    for side, url in (("theirs", ng_stack.their_urls["ng_style_server"]), ("ours", ported_url)):
        env = gym.make("NemoGym/Generic-v0", base_url=url, dataset=[row])
        try:
            env.reset(seed=0)
            results[side] = env.step("Nothing to buy.")
        finally:
            env.close()
    _, reward, terminated, truncated, info = results["theirs"]
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "HTTP 500" in info["error"] and "ZeroDivisionError" in info["error"]
    _, reward, terminated, truncated, info = results["ours"]
    assert (reward, terminated, truncated) == (0.0, False, True)  # no reward either: the verifier judged nothing
    assert info["failure_kind"] == "verifier_error" and "ZeroDivisionError" in info["failure_reason"]
    assert info["mask_sample"] is True and "verifier_error" in info["error"]


def test_multi_step_malformed_answer(ng_stack: NgStack, launched: dict[str, str]) -> None:
    """An extract_synonym_values call whose arguments are not JSON: the tool call itself gets the
    simple agent's error output on both; at /verify theirs raises (500), ours scores it 0."""
    row = our_rows("example_multi_step")[0]
    results = {}
    for side, url in (("theirs", ng_stack.their_urls["example_multi_step"]),
                      ("ours", launched["example_multi_step"])):
        env = gym.make("NemoGym/Generic-v0", base_url=url, dataset=[row])
        try:
            env.reset(seed=0)
            obs, *_ = env.step([call(0, 0, "extract_synonym_values", '{"synonym_values": [1, 2')])
            assert json.loads(obs[0]["output"])["error"].startswith("Invalid tool call arguments")
            results[side] = env.step([message(1, "Submitted.")])
        finally:
            env.close()
    _, reward, terminated, truncated, info = results["theirs"]
    assert (reward, terminated, truncated) == (0.0, False, True) and "HTTP 500" in info["error"]
    _, reward, terminated, truncated, info = results["ours"]
    assert (reward, terminated, truncated) == (0.0, True, False) and "error" not in info
