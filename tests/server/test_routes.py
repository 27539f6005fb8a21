"""NeMo Gym 0.7's routes on every resources server of ours (``server/base.py``, ``server/middleware.py``),
served as real processes on 127.0.0.1: ``/close_session`` (frees the session, idempotent),
``GET /reverify_mode``, the health routes, and the typed seed body beside the row body."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

COUNTER = "example_session_state_mgmt"
WEATHER = "example_single_tool_call"
TYPED = {"resources_session_id": "rs-1", "episode_id": {"rollout_id": "r1", "attempt": 0},
         "task_id": {"taskset": "counter:example", "task_id": "0"},
         "task_data": {"responses_create_params": {"input": "count"}, "initial_count": 7, "expected_count": 9}}

pytestmark = pytest.mark.slow


@pytest.fixture
def counter(launched) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=launched[COUNTER], timeout=10) as client:
        yield client


def count(client: httpx.Client) -> int:
    reply = client.post("/get_counter_value", json={})
    assert reply.status_code == 200, reply.text
    return reply.json()["count"]


def test_close_session_frees_the_session_and_is_idempotent(counter):
    assert counter.post("/seed_session", json={**TYPED["task_data"]}).status_code == 200
    assert counter.post("/increment_counter", json={"count": 2}).status_code == 200
    assert count(counter) == 9
    body = {"resources_session_id": "rs-9", "episode_id": {"rollout_id": "r9", "attempt": 1}}
    first = counter.post("/close_session", json=body)
    assert first.status_code == 200 and first.json() == {"resources_session_id": "rs-9"}
    assert counter.post("/close_session", json=body).json() == {"resources_session_id": "rs-9"}  # again: fine
    assert counter.post("/close_session", json={}).json() == {}
    assert count(counter) == 0  # the state went with the session


def test_close_session_of_a_session_never_seeded_succeeds(launched):
    with httpx.Client(base_url=launched[COUNTER], timeout=10) as fresh:
        assert fresh.post("/close_session", json={}).status_code == 200


@pytest.mark.parametrize("body", [{"resources_session_id": "rs", "extra": 1}, {"episode_id": {"attempt": 0}},
                                  {"resources_session_id": 5}, []])
def test_close_session_refuses_bodies_that_are_not_its_own(counter, body):
    reply = counter.post("/close_session", json=body)
    assert reply.status_code == 422, reply.text


def test_reverify_mode_is_a_bare_string(launched):
    assert httpx.get(f"{launched[WEATHER]}/reverify_mode", timeout=10).json() == "stateless"
    assert httpx.get(f"{launched[COUNTER]}/reverify_mode", timeout=10).json() == "unsupported"
    assert httpx.get(f"{launched['example_multi_step']}/reverify_mode", timeout=10).json() == "unknown"


@pytest.mark.parametrize("route", ["/", "/health", "/healthz", "/readyz", "/livez"])
def test_health_routes_answer_ok(launched, route):
    for url in launched.values():
        reply = httpx.get(f"{url}{route}", timeout=10)
        assert (reply.status_code, reply.json()) == (200, {"status": "ok"})


def test_a_typed_seed_body_seeds_the_session_from_task_data(counter):
    reply = counter.post("/seed_session", json=TYPED)
    assert reply.status_code == 200
    assert reply.json() == {"resources_session_id": "rs-1", "resources_tools": None, "sandbox_access": None}
    assert any(name for name in reply.cookies)  # a session cookie, as NeMo Gym's caller requires
    assert count(counter) == 7


def test_the_row_body_still_seeds(counter):
    reply = counter.post("/seed_session", json={**TYPED["task_data"], "initial_count": 3})
    assert reply.status_code == 200 and reply.json() == {}
    assert count(counter) == 3


@pytest.mark.parametrize("change, field", [
    ({"resources_session_id": ""}, "resources_session_id"),
    ({"episode_id": {"attempt": 0}}, "episode_id"),
    ({"episode_id": {"rollout_id": "r", "attempt": True}}, "episode_id"),
    ({"task_id": {"taskset": "t"}}, "task_id"),
    ({"task_data": [1]}, "task_data"),
    ({"surprise": 1}, "unknown field"),
])
def test_a_malformed_typed_seed_body_is_a_422_naming_the_field(counter, change, field):
    reply = counter.post("/seed_session", json={**TYPED, **change})
    assert reply.status_code == 422 and field in reply.json()["error"], reply.text


def test_a_typed_seed_whose_task_data_the_server_refuses_is_the_servers_422(counter):
    reply = counter.post("/seed_session", json={**TYPED, "task_data": {"initial_count": "seven"}})
    assert reply.status_code == 422
    assert "resources_session_id" not in reply.text  # the server's own error, not a typed success
