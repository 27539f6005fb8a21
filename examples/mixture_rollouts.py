"""A mixture: one vector env whose sub-envs play different environments by weight.

``gym.make_vec("NemoGym/Mixture-v0", envs={id: weight, ...})`` starts each environment's
bundled server on loopback and splits the sub-envs between them by weight (each sub-env plays
one environment for good; ``infos["env_id"]`` names it). Here scripted players stand in for a
model, and the mean reward is printed per environment.

    python examples/mixture_rollouts.py
    python examples/mixture_rollouts.py --num-envs 64 --episodes 400 --math-weight 0.75
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass

import gymnasium as gym

import nemo_gym_env  # noqa: F401  (registers the NemoGym/* ids)
from nemo_gym_env.policies import scripted_player


@dataclass
class Args:
    """Settings of the rollout loop."""

    num_envs: int = 16
    """Concurrent episodes, split between math and mcqa by weight."""
    episodes: int = 64
    """Stop once this many episodes have finished."""
    math_weight: float = 0.5
    """Weight of NemoGym/math-v0; NemoGym/mcqa-v0 gets 1 - this."""
    seed: int = 0
    """Sub-env ``i`` draws its tasks from ``seed + i``."""


def main(args: Args) -> None:
    weights = {"NemoGym/math-v0": args.math_weight, "NemoGym/mcqa-v0": 1.0 - args.math_weight}
    envs = gym.make_vec("NemoGym/Mixture-v0", num_envs=args.num_envs, envs=weights)
    env_ids = envs.unwrapped.env_ids  # the environment each sub-env plays
    players = {env_id: scripted_player(env_id.split("/")[1].removesuffix("-v0")) for env_id in weights}
    obs, infos = envs.reset(seed=args.seed)
    finished, rewards_by_env, started = 0, defaultdict(list), time.perf_counter()
    while finished < args.episodes:
        actions = [players[env_ids[i]](envs.unwrapped.episodes[i].task, []) if live else None
                   for i, live in enumerate(envs.unwrapped.live_mask)]
        obs, rewards, terminations, truncations, infos = envs.step(actions)
        for i in (terminations | truncations).nonzero()[0]:
            rewards_by_env[infos["env_id"][i]].append(float(rewards[i]))
            finished += 1
    elapsed = time.perf_counter() - started
    envs.close()
    print(f"{finished} episodes on {args.num_envs} sub-envs in {elapsed:.1f} s")
    for env_id, rewards in sorted(rewards_by_env.items()):
        print(f"  {env_id}: {env_ids.count(env_id)} sub-envs, {len(rewards)} episodes, "
              f"mean reward {sum(rewards) / len(rewards):.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Scripted rollouts on a math + mcqa mixture.")
    for name, default in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    main(Args(**vars(parser.parse_args())))
