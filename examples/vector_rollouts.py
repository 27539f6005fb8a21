"""Vectorized rollouts: many concurrent episodes on one server, one event loop, one pool.

Copy this loop and swap the scripted player for your model. ``gym.make_vec`` starts the
bundled server on loopback (no API key, no network service); every sub-env is one
episode with its own session cookie. After an episode ends, its sub-env resets itself at
the next step (``NEXT_STEP`` autoreset), and during that step it takes ``None`` as its
action: ``envs.unwrapped.live_mask`` says which sub-envs want a real action, so the policy
only generates for those.

    python examples/vector_rollouts.py
    python examples/vector_rollouts.py --num-envs 1024 --episodes 5000
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import gymnasium as gym

import nemo_gym_env  # noqa: F401  (registers the NemoGym/* ids)
from nemo_gym_env.policies import scripted_player


@dataclass
class Args:
    """Settings of the rollout loop."""

    server: str = "example_multi_step"
    """Bundled server to play (it ships a scripted player in ``scripted.py``)."""
    num_envs: int = 64
    """Concurrent episodes."""
    episodes: int = 500
    """Stop once this many episodes have finished."""
    seed: int = 0
    """Sub-env ``i`` draws its tasks from ``seed + i``."""


def main(args: Args) -> None:
    envs = gym.make_vec(f"NemoGym/{args.server}-v0", num_envs=args.num_envs)
    policy = scripted_player(args.server)  # (row, history) -> action; your model goes here
    obs, infos = envs.reset(seed=args.seed)
    histories: list[list[dict]] = [[] for _ in range(args.num_envs)]
    finished, reward_sum, started = 0, 0.0, time.perf_counter()
    while finished < args.episodes:
        actions = []
        for i, live in enumerate(envs.unwrapped.live_mask):
            if not live:  # this sub-env resets during this step: no action needed
                histories[i] = []
                actions.append(None)
                continue
            histories[i].extend(item for item in obs[i] if item.get("type") == "function_call_output")
            task = envs.unwrapped.episodes[i].task  # the row being played (a model reads obs instead)
            actions.append(policy(task, histories[i]))
        obs, rewards, terminations, truncations, infos = envs.step(actions)
        done = terminations | truncations
        finished += int(done.sum())
        reward_sum += float(rewards[done].sum())
        if "_error" in infos and infos["_error"].any():
            print("server errors:", [e for e, bad in zip(infos["error"], infos["_error"]) if bad][:3])
    elapsed = time.perf_counter() - started
    envs.close()
    print(f"{finished} episodes on {args.num_envs} sub-envs in {elapsed:.1f} s "
          f"({finished / elapsed:.0f} episodes/s), mean reward {reward_sum / finished:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Vectorized scripted rollouts on a bundled server.")
    for name, default in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    main(Args(**vars(parser.parse_args())))
