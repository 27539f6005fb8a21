"""Fixtures for policy tests: the test OpenAI server process and an episode driver."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.policies import Policy, PolicyRequest, PolicyTurn


@pytest.fixture(scope="session")
def openai_base_url() -> Iterator[str]:
    """``/v1`` root of one ``tests/fixtures/openai_server.py`` process for the session."""
    from tests.fixtures.openai_server import running_server

    with running_server() as url:
        yield url


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released: a connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def play(env: Any, policy: Policy, *, max_turns: int = 8, **reset_kwargs: Any) -> tuple[float, list[PolicyTurn], dict]:
    """One episode of ``policy`` on ``env``; returns (reward, the policy's turns, last info).

    Each turn's ``action()`` (items with token data on the last one) goes to ``env.step`` and
    into the history, followed by the env's observation, as a rollout loop would do.
    """
    task_input, info = env.reset(**reset_kwargs)
    tools, sampling, row = info["tools"], info["sampling"], env.unwrapped.task
    history: list[dict[str, Any]] = []
    turns: list[PolicyTurn] = []
    for _ in range(max_turns):
        request = PolicyRequest(input=task_input, history=list(history), tools=tools, sampling=sampling, row=row)
        turn = background_loop().run(policy.generate(request))
        turns.append(turn)
        action = turn.action()
        obs, reward, terminated, truncated, info = env.step(action)
        history += action + obs
        if terminated or truncated:
            return reward, turns, info
    raise AssertionError(f"episode did not end in {max_turns} turns")
