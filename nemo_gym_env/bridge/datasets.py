"""Task rows for hosted envs: one row per seed, train and held-out rows disjoint by seed.

A row of a hosted env is its prompt (the env's rules and the answer format, as a system message)
and a ``seed``; the server resets the env with it, so each row is one episode, the same one every
time. Train seeds count up from ``first_seed``; held-out seeds from :data:`HELDOUT_FIRST_SEED`
+ ``first_seed``, so no held-out row replays a train row's episode.

Example:
    >>> rows = make_dataset("gymnasium:CliffWalking-v1", 2)
    >>> [(r["seed"], r["split"]) for r in rows]
    [(0, 'train'), (1, 'train')]
    >>> make_dataset("gymnasium:CliffWalking-v1", 1, split="heldout")[0]["seed"]
    1000000000

From a shell (a bundled server's name, or a ``gymnasium:`` / ``textarena:`` target, with its settings)::

    python -m nemo_gym_env.bridge.datasets gymnasium:FrozenLake-v1 --size 500 --split train --out train.jsonl
    python -m nemo_gym_env.bridge.datasets frozen_lake --size 100 --split heldout --out heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from nemo_gym_env.bridge.targets import LIBRARIES, check_hosted, is_target, target_config
from nemo_gym_env.errors import ConfigError
from nemo_gym_env.protocol.dataset import write_rows

__all__ = ["HELDOUT_FIRST_SEED", "SPLITS", "example_rows", "main", "make_dataset", "prompt_of", "server_block"]

SPLITS = ("train", "heldout")
HELDOUT_FIRST_SEED = 1_000_000_000
"""Held-out seeds start here (train seeds at 0): disjoint for any dataset smaller than this."""


def server_block(target: str, **settings: Any) -> dict[str, Any]:
    """The config block of a target (``gymnasium:ID``, ``textarena:GAME``) or a bundled hosted server."""
    if is_target(target):
        block = next(iter(next(iter(target_config(target).values()))["resources_servers"].values()))
    else:
        from nemo_gym_env.launch.catalog import bundled_spec

        block = dict(bundled_spec(target).config)
        if not any(key in block for _, key, _ in LIBRARIES.values()):
            raise ConfigError(f"{target!r} is not a hosted env (no env_id or game in its config)")
    return {**block, **settings}


def prompt_of(block: dict[str, Any]) -> str:
    """The system prompt of a hosted env's rows: its rules and how to answer."""
    # a wrong block fails here, in one line that names its env (or game)
    server = check_hosted(str(block.get("env_id") or block.get("game") or "hosted env"), dict(block))
    if "env_id" in block:
        from nemo_gym_env.bridge.gymnasium_env import task_prompt

        return task_prompt(server.config, server.action_format)
    game = block["game"]
    rules = block.get("instructions") or (
        f"You are playing the TextArena game {game}. The game's messages come to you as user turns; answer each "
        "with your next move, written the way the game's rules ask for it.")
    return str(rules)


def example_rows(block: dict[str, Any], size: int = 8) -> list[dict[str, Any]]:
    """The rows a hosted server plays when no dataset is given: ``size`` train seeds of its block."""
    library = "gymnasium" if "env_id" in block else "textarena"
    return _rows(prompt_of(block), f"{library}:{block.get('env_id') or block.get('game')}", range(size), "train")


def _rows(prompt: str, name: str, seeds: Sequence[int], split: str) -> list[dict[str, Any]]:
    return [{"responses_create_params": {"input": [{"role": "system", "content": prompt}]}, "seed": seed,
             "split": split, "env": name} for seed in seeds]


def make_dataset(target: str, size: int, *, split: str = "train", first_seed: int = 0,
                 **settings: Any) -> list[dict[str, Any]]:
    """``size`` rows of a hosted env, one per seed of ``split``.

    Args:
        target: ``gymnasium:ENV_ID``, ``textarena:GAME`` or a bundled hosted server's name.
        size: How many rows.
        split: ``"train"`` or ``"heldout"`` (seeds from :data:`HELDOUT_FIRST_SEED`).
        first_seed: Where the split's seeds start (its offset).
        **settings: More keys of the server's config (``env_kwargs``, ``instructions``, ...).
    """
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if size < 0 or first_seed < 0 or first_seed + size > HELDOUT_FIRST_SEED:
        raise ConfigError(f"size and first_seed must be >= 0 with first_seed + size <= {HELDOUT_FIRST_SEED}")
    base = (HELDOUT_FIRST_SEED if split == "heldout" else 0) + first_seed
    return _rows(prompt_of(server_block(target, **settings)), target, range(base, base + size), split)


def main(argv: Sequence[str] | None = None) -> int:
    """Write rows as JSONL (``--out``, or standard output)."""
    parser = argparse.ArgumentParser(prog="python -m nemo_gym_env.bridge.datasets", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="gymnasium:ENV_ID, textarena:GAME or a bundled hosted server")
    parser.add_argument("--size", type=int, default=100, help="rows (default 100)")
    parser.add_argument("--split", choices=SPLITS, default="train")
    parser.add_argument("--first-seed", type=int, default=0, help="offset of the split's seeds (default 0)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="a config key of the server, e.g. --set 'env_kwargs={\"is_slippery\": false}'")
    parser.add_argument("--out", help="output JSONL (default: standard output)")
    args = parser.parse_args(argv)
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item!r}: use KEY=JSON")
        try:
            settings[key] = json.loads(value)
        except ValueError:
            settings[key] = value
    try:
        rows = make_dataset(args.target, args.size, split=args.split, first_seed=args.first_seed, **settings)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_rows(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
