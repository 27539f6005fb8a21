"""NeMo Gym 0.7's typed session contract, kept by every server of ours (``TypedSeedMiddleware``'s ledger),
and the session store's hook for state it drops."""

from __future__ import annotations

from nemo_gym_env.launch.catalog import bundled_servers
from nemo_gym_env.server.sessions import SessionStore
from nemo_gym_env.server.testing import app_client, example_rows
from nemo_gym_env.servers.example_single_tool_call.app import SimpleWeatherResourcesServer

ROW = example_rows(bundled_servers()["example_single_tool_call"])[0]


def typed(session: str, rollout: str = "r1", task: str = "t1") -> dict:
    return {"resources_session_id": session, "episode_id": {"rollout_id": rollout, "attempt": 0},
            "task_id": {"taskset": "weather", "task_id": task}, "task_data": ROW}


def test_repeat_seed_conflict_close_and_late_seed():
    with app_client(SimpleWeatherResourcesServer, {}, name="weather") as client:
        first = client.post("/seed_session", json=typed("s1"))
        assert first.status_code == 200 and first.json()["resources_session_id"] == "s1"
        assert client.post("/seed_session", json=typed("s1")).json()["resources_session_id"] == "s1"  # idempotent
        conflict = client.post("/seed_session", json=typed("s1", task="t2"))
        assert conflict.status_code == 409 and "already seeded for another" in conflict.text
        close = {"resources_session_id": "s1", "episode_id": {"rollout_id": "r1", "attempt": 0}}
        for _ in range(2):
            assert client.post("/close_session", json=close).json() == {"resources_session_id": "s1"}
        late = client.post("/seed_session", json=typed("s1"))
        assert late.status_code == 409 and "is closed" in late.text
        never = {"resources_session_id": "s2", "episode_id": {"rollout_id": "r9", "attempt": 0}}
        assert client.post("/close_session", json=never).status_code == 200
        assert client.post("/seed_session", json=typed("s2")).status_code == 409  # closed before it was seeded
        assert client.post("/seed_session", json=ROW).status_code == 200  # a row body: untouched


def test_the_store_hands_dropped_state_to_its_hook():
    dropped = []
    clock = [0.0]
    store = SessionStore(max_sessions=2, ttl_s=10, clock=lambda: clock[0], on_drop=dropped.append)
    store["a"], store["b"], store["c"] = 1, 2, 3  # over the cap: a is dropped
    assert dropped == [1]
    del store["b"]  # deleted by its owner: not dropped
    clock[0] = 100.0
    assert len(store) == 0 and dropped == [1, 3]  # expired
