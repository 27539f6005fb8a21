"""``nemo-gym-env view`` and ``nemo-gym-env play``: the local web pages (:mod:`nemo_gym_env.viewer`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from nemo_gym_env.cli.common import add_env_yaml, add_listen, describe, env_yaml_path, split_targets
from nemo_gym_env.envs.registration import GENERIC_ID, env_id
from nemo_gym_env.errors import UsageError
from nemo_gym_env.launch.config import parse_overrides
from nemo_gym_env.rollouts.settings import DEFAULT_OUTPUT
from nemo_gym_env.viewer.play_app import EnvSpec
from nemo_gym_env.viewer.run import env_yaml_secrets, run_play, run_view

__all__ = ["cmd_play", "cmd_view", "play_arguments", "view_arguments"]


def view_arguments(p: argparse.ArgumentParser) -> None:
    """``view``'s arguments."""
    describe(p, "Serve a local page over rollout JSONL files (and their _failures.jsonl sidecars): the "
             "list (filter, sort), each rollout's conversation, tool calls and verify reply, a task's rollouts side by "
             "side, and the summary that `rollouts` prints. Files still being written are followed. Binds 127.0.0.1.",
             "view", "view results/rollouts.jsonl other/rollouts.jsonl --port 8080")
    p.add_argument("paths", nargs="*", metavar="PATH", help=f"rollout files (default {DEFAULT_OUTPUT})")
    add_listen(p)
    p.add_argument("--max-row-mb", type=float, default=16.0, metavar="MB",
                   help="longest line read as a row (default 16); longer ones are listed as errors")
    add_env_yaml(p)


def play_arguments(p: argparse.ArgumentParser) -> None:
    """``play``'s arguments."""
    describe(p, "Serve a local page where a person plays one episode at a time through the same "
             "NemoGymEnv a policy uses: the task's messages, a form per tool, each output, a final answer, then the "
             "reward and the verify reply. A finished episode can be saved as a rollout row. Binds 127.0.0.1.",
             "play example_multi_step", "play ./my_env                # a server folder, as init writes it",
             'play "+config_paths=[my_env/configs/my_env.yaml]" --input my_env/data/example.jsonl',
             "play --server-url http://127.0.0.1:8000 --input tasks.jsonl")
    p.add_argument("targets", nargs="*", metavar="NAME|+config_paths=[...]",
                   help="a bundled server, a server folder, gymnasium:ID / textarena:GAME, or a config")
    p.add_argument("--server-url", metavar="URL", help="play a running resources server (with --input)")
    p.add_argument("--input", "-i", metavar="PATH", help="tasks JSONL (default: the server's example data)")
    p.add_argument("--output", "-o", metavar="PATH", default="results/played.jsonl",
                   help="where saved episodes go (default results/played.jsonl)")
    add_listen(p)
    p.add_argument("--max-steps", type=int, default=64, metavar="N",
                   help="turns before the episode is verified anyway (default 64)")
    add_env_yaml(p)


def _secrets(args: argparse.Namespace) -> list[str]:
    return env_yaml_secrets(env_yaml_path(args), required=bool(getattr(args, "env_yaml", None)))


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the rollout viewer over rollout files until Ctrl-C."""
    if args.max_row_mb <= 0:
        raise UsageError(f"--max-row-mb must be > 0, got {args.max_row_mb}")
    return run_view(args.paths or [DEFAULT_OUTPUT], host=args.host, port=args.port, secrets=_secrets(args),
                    max_row_bytes=int(args.max_row_mb * 2**20))


def cmd_play(args: argparse.Namespace) -> int:
    """Serve a page to play one environment by hand until Ctrl-C."""
    names, overrides = split_targets(args.targets)
    config_paths, others = parse_overrides(overrides)
    if others:
        raise UsageError(f"play takes a server name, \"+config_paths=[...]\" or --server-url, not {others[0]!r}")
    if len(names) > 1 or (args.server_url and config_paths):
        raise UsageError("play one server: a bundled NAME, \"+config_paths=[...]\" (NAME picks an instance) or "
                         "--server-url")
    if args.max_steps < 1:
        raise UsageError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.server_url and not args.server_url.startswith(("http://", "https://")):
        raise UsageError(f"--server-url must be an http:// or https:// URL, got {args.server_url!r}")
    kwargs: dict[str, Any] = {"max_steps": args.max_steps}
    if args.input:
        if not Path(args.input).is_file():
            raise UsageError(f"dataset {args.input!r} not found")
        kwargs["dataset"] = args.input
    if args.server_url or config_paths:
        if not args.input:
            raise UsageError("--server-url and \"+config_paths=[...]\" need the tasks: --input tasks.jsonl")
        if args.server_url:
            kwargs["base_url"] = args.server_url
        else:
            kwargs["config_paths"] = config_paths
        if names:
            kwargs["server"] = names[0]
        spec = EnvSpec(GENERIC_ID, kwargs)
    elif names:
        from nemo_gym_env.envs.sources import ServerSet

        servers = ServerSet.launching(names, check=False)  # an unknown name fails here, listing the bundled ones
        if len(servers) != 1:
            raise UsageError(f"{names[0]} defines {len(servers)} servers; play one: \"+config_paths=[...]\" and its NAME")
        if next(iter(servers)).bundled == names[0]:
            spec = EnvSpec(env_id(names[0]), kwargs)
        else:  # a server folder, a gymnasium:/textarena: target: its example rows, or one row per seed
            spec = EnvSpec(GENERIC_ID, {**kwargs, "server": names[0]})
    else:
        raise UsageError("name a server to play: a bundled NAME (see `nemo-gym-env list`), \"+config_paths=[...]\" "
                         "or --server-url URL --input tasks.jsonl")
    return run_play(spec, host=args.host, port=args.port, output=args.output, secrets=_secrets(args))
