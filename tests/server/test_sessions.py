"""Bounded, expiring session state (``server.sessions``)."""

from __future__ import annotations

import pytest

from nemo_gym_env.server.sessions import SessionStore


def test_session_store_cap_and_ttl():
    now = [0.0]
    store = SessionStore(max_sessions=3, ttl_s=10, clock=lambda: now[0])
    for key in "abcd":
        store[key] = key
    assert sorted(store) == ["b", "c", "d"] and store.evicted == 1
    now[0] = 5.0
    assert store["b"] == "b"  # touching refreshes
    now[0] = 12.0
    assert sorted(store) == ["b"] and store.expired == 2
    assert store.get_or_create("z", lambda: 9) == 9
    assert store.stats()["live"] == 2
    with pytest.raises(ValueError):
        SessionStore(max_sessions=0)
