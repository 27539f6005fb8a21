"""Gymnasium's toy-text envs served by the bridge return, seed by seed, what the raw env returns for the same actions.

Each bundled toy-text server (``frozen_lake``, ``taxi``, ``blackjack``, ``cliff_walking``) is played by its
scripted player, which reads only the observations, through ``gym.make``, the vector env and
``nemo-gym-env rollouts``; the actions it took are then replayed on ``gym.make(<raw id>)`` reset with the
row's seed, and the returns (and where the episode ended) must be equal.
"""

from __future__ import annotations

import importlib
import json

import gymnasium as gym
import pytest

import nemo_gym_env  # noqa: F401 - registers the ids
from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.protocol.items import content_text

from ..cli.conftest import read_jsonl, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOY_TEXT = {"frozen_lake": "FrozenLake-v1", "taxi": "Taxi-v4", "blackjack": "Blackjack-v1",
            "cliff_walking": "CliffWalking-v1"}
SEEDS = range(6)
MAX_STEPS = 250


def player(server: str):
    return importlib.import_module(f"nemo_gym_env.servers.{server}.scripted").scripted_action


def action_format(server: str):
    return GymnasiumEnvServer.from_config(bundled_spec(server).config, server).action_format


def said(items) -> list[str]:
    return [content_text(m.get("content")) for m in items if m.get("type", "message") == "message"
            and m.get("role") == "user"]


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


@pytest.mark.parametrize("server", ["taxi", "blackjack"])
def test_the_vector_env_returns_the_raw_envs_returns(server):
    play, fmt = player(server), action_format(server)
    num = 4
    envs = gym.make_vec(f"NemoGym/{server}-v0", num_envs=num, max_steps=MAX_STEPS, autoreset_mode="Disabled")
    try:
        obs, infos = envs.reset(seed=list(range(100, 100 + num)))
        seen = [said(o) for o in obs]
        actions: list[list[int]] = [[] for _ in range(num)]
        totals, done, ends = [0.0] * num, [False] * num, [None] * num
        rows = [envs.unwrapped.rows[int(i)] for i in infos["task_index"]]
        while not all(done):
            turns = [None if done[i] else play({}, [], observations=seen[i]) for i in range(num)]
            for i, turn in enumerate(turns):
                if turn is not None:
                    actions[i].append(fmt.parse(turn[0]["content"][0]["text"]))
            obs, rewards, terminations, truncations, _ = envs.step(turns)
            for i in range(num):
                if not done[i]:
                    totals[i] += float(rewards[i])
                    seen[i] += said(obs[i])
                    if terminations[i] or truncations[i]:
                        done[i], ends[i] = True, (bool(terminations[i]), bool(truncations[i]))
        for i in range(num):
            assert (totals[i], *ends[i]) == raw_return(TOY_TEXT[server], rows[i]["seed"], actions[i])
    finally:
        envs.close()


def test_rollouts_rows_hold_the_raw_envs_returns(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    done = run_cli("rollouts", *sorted(TOY_TEXT), "--policy", "scripted", "--max-steps", str(MAX_STEPS),
                   "--output", str(out), timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_jsonl(out)
    assert len(rows) == sum(8 for _ in TOY_TEXT)
    formats = {server: action_format(server) for server in TOY_TEXT}
    for row in rows:
        server = row["agent_ref"]["name"]
        turns = [content_text(item["content"]) for item in row["response"]["output"]
                 if item.get("type") == "message" and item.get("role") == "assistant"]
        actions = [formats[server].parse(text) for text in turns]
        total, terminated, truncated = raw_return(TOY_TEXT[server], row["seed"], actions)
        assert (row["reward"], row["terminated"], row["truncated"]) == (total, terminated, truncated), json.dumps(
            {k: row[k] for k in ("seed", "reward")})
