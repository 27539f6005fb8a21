"""Quickstart: play every bundled example server's tasks through ``gymnasium.make``.

No API key, no model: each server ships a deterministic *scripted* policy (correct play,
and deliberately wrong play) so you can see the whole loop — reset, tool calls, verify —
and the rewards the server gives. Swap ``scripted_action`` for your model to train.

    python examples/quickstart.py
"""

from __future__ import annotations

import importlib

import gymnasium as gym

import nemo_gym_env  # noqa: F401  (registers the NemoGym/* ids)

SERVERS = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt"]


def play(env: gym.Env, scripted_action, task_index: int, correct: bool) -> tuple[float, int]:
    """One episode with the scripted policy; returns (reward, turns)."""
    obs, info = env.reset(options={"task_index": task_index})
    row = env.unwrapped.task
    history: list[dict] = []
    for turn in range(1, 100):
        action = scripted_action(row, history, correct=correct)
        obs, reward, terminated, truncated, info = env.step(action)
        history.extend(obs)
        if terminated or truncated:
            if "error" in info:
                print(f"    error: {info['error']}")
            return reward, turn
    raise RuntimeError("episode did not end")


def main() -> None:
    for server in SERVERS:
        scripted_action = importlib.import_module(f"nemo_gym_env.servers.{server}.scripted").scripted_action
        env = gym.make(f"NemoGym/{server}-v0")  # starts the bundled server on loopback
        print(f"NemoGym/{server}-v0  ({len(env.unwrapped.rows)} tasks, server at {env.unwrapped.base_url})")
        for task_index in range(len(env.unwrapped.rows)):
            for correct in (True, False):
                reward, turns = play(env, scripted_action, task_index, correct)
                label = "correct" if correct else "wrong  "
                print(f"  task {task_index}  scripted {label} play: reward {reward:.1f} after {turns} turn(s)")
        env.close()


if __name__ == "__main__":
    main()
