"""Playing hosted envs with their scripted players through the vector env and ``nemo-gym-env rollouts``,
and reading back the moves each episode made (to replay them on the raw env)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import gymnasium as gym

from nemo_gym_env.protocol.items import content_text

from ..cli.conftest import read_jsonl, run_cli


def player(server: str) -> Any:
    return importlib.import_module(f"nemo_gym_env.servers.{server}.scripted").scripted_action


def said(items: list[dict[str, Any]]) -> list[str]:
    """The text of the user messages among ``items``: what the env told the player."""
    return [content_text(m.get("content")) for m in items if m.get("type", "message") == "message"
            and m.get("role") == "user"]


def turn_text(turn: list[dict[str, Any]]) -> str:
    return "".join(content_text(item.get("content")) for item in turn if item.get("type") == "message")


def play_vector(server: str, num_envs: int, first_seed: int, max_steps: int) -> list[dict[str, Any]]:
    """One episode per sub-env (autoreset off): each one's row seed, moves (text), return and end flags."""
    play = player(server)
    envs = gym.make_vec(f"NemoGym/{server}-v0", num_envs=num_envs, max_steps=max_steps, autoreset_mode="Disabled")
    try:
        obs, infos = envs.reset(seed=list(range(first_seed, first_seed + num_envs)))
        rows = [envs.unwrapped.rows[int(i)] for i in infos["task_index"]]
        seen = [said(o) for o in obs]
        episodes = [{"seed": row["seed"], "moves": [], "return": 0.0, "end": None} for row in rows]
        while any(e["end"] is None for e in episodes):
            turns = [None if e["end"] is not None else play({}, [], observations=seen[i])
                     for i, e in enumerate(episodes)]
            obs, rewards, terminations, truncations, _ = envs.step(turns)
            for i, episode in enumerate(episodes):
                if turns[i] is None:
                    continue
                episode["moves"].append(turn_text(turns[i]))
                episode["return"] += float(rewards[i])
                seen[i] += said(obs[i])
                if terminations[i] or truncations[i]:
                    episode["end"] = (bool(terminations[i]), bool(truncations[i]))
        return episodes
    finally:
        envs.close()


def play_rollouts(servers: list[str], out: Path, max_steps: int) -> list[dict[str, Any]]:
    """``nemo-gym-env rollouts SERVERS --policy scripted``: each row with its moves (the assistant texts)."""
    done = run_cli("rollouts", *servers, "--policy", "scripted", "--max-steps", str(max_steps), "--output", str(out),
                   timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_jsonl(out)
    for row in rows:
        row["moves"] = [content_text(item["content"]) for item in row["response"]["output"]
                        if item.get("type") == "message" and item.get("role") == "assistant"]
    return rows
