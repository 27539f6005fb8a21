"""Shared fixtures: bundled servers launched once per test session, scripted policies."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nemo_gym_env.launch.catalog import bundled_servers

EXAMPLES = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt"]
BUNDLED = sorted(bundled_servers())


def scripted(server: str) -> Callable:
    """The bundled server's scripted player: ``scripted_action(row, history, correct=...)``."""
    return importlib.import_module(f"nemo_gym_env.servers.{server}.scripted").scripted_action


def example_rows(server: str) -> list[dict]:
    from nemo_gym_env.launch.catalog import bundled_dataset

    return [json.loads(line) for line in Path(bundled_dataset(server)).read_text().splitlines() if line.strip()]


def play_episode(env, server: str, *, correct: bool = True, **reset_kwargs) -> tuple[float, bool, bool, dict]:
    """Play one scripted episode on a (single) env; returns the last (reward, terminated, truncated, info)."""
    obs, info = env.reset(**reset_kwargs)
    row = env.unwrapped.task
    history: list[dict] = []
    action = scripted(server)
    for _ in range(50):
        obs, reward, terminated, truncated, info = env.step(action(row, history, correct=correct))
        history.extend(obs)
        if terminated or truncated:
            return reward, terminated, truncated, info
    raise AssertionError("episode did not end in 50 turns")


@pytest.fixture(scope="session")
def launched() -> Iterator[dict[str, str]]:
    """One launched process per example server for the whole session: name -> base URL."""
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher() as launcher:
        processes = launcher.start_all([bundled_spec(name) for name in EXAMPLES])
        yield {p.name: p.url for p in processes}
