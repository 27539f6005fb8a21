"""The process-wide servers behind ``gym.make`` (``launch.shared``): shared, reference counted."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from nemo_gym_env import launch
from nemo_gym_env.launch.shared import acquire_server, release_server

from ..conftest import group_members


def test_release_without_acquire_raises():
    with pytest.raises(KeyError):
        release_server("never_acquired")


@pytest.mark.slow
def test_acquire_release_is_shared_and_reference_counted(launch_specs):
    spec = dataclasses.replace(launch_specs["fixture_ok"], instance_name="fixture_shared")
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda _: acquire_server(spec), range(4)))
    try:
        assert len({id(p) for p in procs}) == 1 and len({p.pid for p in procs}) == 1
        proc = procs[0]
        assert httpx.get(f"{proc.url}/").status_code == 200
        assert launch.shared_servers()["fixture_shared"] is proc
        for _ in range(3):
            release_server("fixture_shared")
        assert proc.alive()
    finally:
        release_server("fixture_shared")
    assert not proc.alive() and group_members(proc.pid) == []
    assert "fixture_shared" not in launch.shared_servers()
    with pytest.raises(KeyError):
        release_server("fixture_shared")


@pytest.mark.slow
def test_acquire_runs_while_starting_only_when_it_starts_the_server(launch_specs):
    spec = dataclasses.replace(launch_specs["fixture_ok"], instance_name="fixture_meanwhile")
    calls = []
    first = acquire_server(spec, while_starting=lambda: calls.append("first"))
    try:
        second = acquire_server(spec, while_starting=lambda: calls.append("second"))
        release_server("fixture_meanwhile")
        assert second is first and calls == ["first"]
    finally:
        release_server("fixture_meanwhile")
    assert not first.alive()
