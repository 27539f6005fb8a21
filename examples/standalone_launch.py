"""Standalone launch: servers and a head server from Python, then clients that find them through it.

What ``nemo-gym-env serve example_multi_step`` does, spelled out; and what a client in
another process does with the head server's address alone (here, the same process).
No API key, no model: the bundled scripted player stands in for one.

    python examples/standalone_launch.py

From a shell, the same in two terminals::

    nemo-gym-env serve example_multi_step                     # prints the head server URL
    nemo-gym-env rollouts --head-url http://127.0.0.1:11000 --policy scripted
"""

from __future__ import annotations

import asyncio

import gymnasium as gym

import nemo_gym_env  # noqa: F401  (registers NemoGym/Generic-v0)
from nemo_gym_env.client import fetch_global_config, fetch_servers
from nemo_gym_env.launch import (
    HeadServer,
    Launcher,
    bundled_config_path,
    bundled_dataset,
    load_config,
    server_specs,
)
from nemo_gym_env.policies import ScriptedPolicy
from nemo_gym_env.protocol import load_rows
from nemo_gym_env.rollouts import collect

SERVER = "example_multi_step"
CONFIG = bundled_config_path(SERVER)


def one_episode(base_url: str) -> float:
    """Play one task through gymnasium with the scripted player; returns the reward."""
    from nemo_gym_env.policies import scripted_player

    play = scripted_player(SERVER)
    env = gym.make("NemoGym/Generic-v0", base_url=base_url, dataset=str(bundled_dataset(SERVER)))
    env.reset(seed=0)
    history: list[dict] = []
    while True:
        obs, reward, terminated, truncated, _ = env.step(play(env.unwrapped.task, history))
        history.extend(obs)
        if terminated or truncated:
            env.close()
            return reward


async def some_rollouts(base_url: str) -> list[float]:
    """Four rollouts of each of the first two tasks, four at a time, as ``nemo-gym-env rollouts`` runs them."""
    rows = load_rows(bundled_dataset(SERVER))[:2]
    results = [row async for row in collect(rows, ScriptedPolicy(SERVER), base_url, num_repeats=4, concurrency=4)]
    return [row["reward"] for row in results]


def main() -> None:
    cfg = load_config([CONFIG], ["+head_server.port=0"], env_yaml=None)  # port 0: any free port
    with Launcher() as launcher, HeadServer(cfg, launcher.start_all(server_specs(cfg)), port=0) as head:
        print(f"head server at {head.url}")

        # A client knows only the head server's URL.
        servers = fetch_servers(head.url)
        print("servers:", servers)
        block = fetch_global_config(head.url)[SERVER]["resources_servers"][SERVER]
        print(f"{SERVER} listens on {block['host']}:{block['port']} (from /global_config_dict_yaml)")

        url = servers[SERVER]
        print("episode reward:", one_episode(url))
        print("rollout rewards:", asyncio.run(some_rollouts(url)))
    print("stopped: no server left running")


if __name__ == "__main__":
    main()
