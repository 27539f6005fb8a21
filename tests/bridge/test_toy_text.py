"""Gymnasium's toy-text envs served by the bridge return, seed by seed, what the raw env returns for the same actions.

Each bundled toy-text server (``frozen_lake``, ``taxi``, ``blackjack``, ``cliff_walking``) is played by its
scripted player, which reads only the observations, through ``gym.make``, the vector env and
``nemo-gym-env rollouts``; the actions it took are then replayed on ``gym.make(<raw id>)`` reset with the
row's seed, and the returns (and where the episode ended) must be equal.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import nemo_gym_env  # noqa: F401 - registers the ids
from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer
from nemo_gym_env.launch.catalog import bundled_spec

from .playing import play_rollouts, play_vector, player, said

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOY_TEXT = {"frozen_lake": "FrozenLake-v1", "taxi": "Taxi-v4", "blackjack": "Blackjack-v1",
            "cliff_walking": "CliffWalking-v1"}
SEEDS = range(6)
MAX_STEPS = 250


def action_format(server: str):
    return GymnasiumEnvServer.from_config(bundled_spec(server).config, server).action_format


def raw_return(env_id: str, seed: int, actions: list[int]) -> tuple[float, bool, bool]:
    """Play ``actions`` on the raw env reset with ``seed``: (return, terminated, truncated) at the last one."""
    env = gym.make(env_id)
    env.reset(seed=seed)
    total, terminated, truncated = 0.0, False, False
    for action in actions:
        assert not (terminated or truncated), "the raw episode ended before the actions did"
        _, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
    env.close()
    return total, terminated, truncated


@pytest.mark.parametrize("server", sorted(TOY_TEXT))
def test_gym_make_returns_the_raw_envs_return_seed_by_seed(server):
    play, fmt = player(server), action_format(server)
    env = gym.make(f"NemoGym/{server}-v0", max_steps=MAX_STEPS)
    returns = []
    try:
        for seed in SEEDS:
            obs, info = env.reset(seed=seed)
            seen, total, actions = said(obs), 0.0, []
            while True:
                turn = play({}, [], observations=seen)
                actions.append(fmt.parse(turn[0]["content"][0]["text"]))
                obs, reward, terminated, truncated, info = env.step(turn)
                total += reward
                seen += said(obs)
                if terminated or truncated:
                    break
            row_seed = env.unwrapped.last_verify["seed"]
            assert (total, terminated, truncated) == raw_return(TOY_TEXT[server], row_seed, actions), (seed, actions)
            assert info["reward"] == total  # the episode's return, as a rollout row holds it
            returns.append(total)
    finally:
        env.close()
    if server == "cliff_walking":
        assert returns == [-13.0] * len(SEEDS)  # the safe path, every time
    if server == "taxi":
        assert all(r > 0 for r in returns)  # every passenger delivered


def test_the_same_seed_plays_the_same_episode_and_a_generic_id_serves_any_registered_env():
    env = gym.make("NemoGym/Gymnasium-v0", env_id="FrozenLake-v1", max_steps=MAX_STEPS)
    other = gym.make("NemoGym/Gymnasium-v0", env_id="FrozenLake-v1", server_config={"env_kwargs": {"is_slippery": False}})
    try:
        first, _ = env.reset(seed=42)
        again, _ = env.reset(seed=42)
        assert first == again and "You are at row 1, column 1." in first[-1]["content"]
        moves = ["<action>down</action>", "<action>down</action>", "<action>right</action>", "<action>right</action>",
                 "<action>down</action>", "<action>right</action>"]
        other.reset(seed=0)
        for move in moves:  # the path around the holes, on ice that does not slip
            _, reward, terminated, _, _ = other.step(move)
        assert (reward, terminated) == (1.0, True)
    finally:
        env.close()
        other.close()


@pytest.mark.parametrize("server", sorted(TOY_TEXT))
def test_the_vector_env_returns_the_raw_envs_returns(server):
    fmt = action_format(server)
    for episode in play_vector(server, 4, 100, MAX_STEPS):
        actions = [fmt.parse(move) for move in episode["moves"]]
        assert (episode["return"], *episode["end"]) == raw_return(TOY_TEXT[server], episode["seed"], actions)


def test_rollouts_rows_hold_the_raw_envs_returns(tmp_path):
    rows = play_rollouts(sorted(TOY_TEXT), tmp_path / "rollouts.jsonl", MAX_STEPS)
    assert len(rows) == 8 * len(TOY_TEXT)
    formats = {server: action_format(server) for server in TOY_TEXT}
    for row in rows:
        server = row["agent_ref"]["name"]
        actions = [formats[server].parse(text) for text in row["moves"]]
        total, terminated, truncated = raw_return(TOY_TEXT[server], row["seed"], actions)
        assert (row["reward"], row["terminated"], row["truncated"]) == (total, terminated, truncated), json.dumps(
            {k: row[k] for k in ("seed", "reward")})
