"""``nemo-gym-env reverify``: re-send stored rollouts' verify bodies to the current servers (no policy).

Servers come as ``rollouts`` gets them: launched by the command (the servers the rows name in
``agent_ref``, bundled NAMEs, or ``+config_paths=[...]``), or already running (``--server-url``
for one server, ``--head-url``). See :mod:`nemo_gym_env.rollouts.reverify`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from nemo_gym_env.cli.common import add_env_yaml, describe, env_yaml_path, say, split_targets
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.sources import ServerSet
from nemo_gym_env.errors import Stopped, UsageError
from nemo_gym_env.rollouts.identity import server_of
from nemo_gym_env.rollouts.output import RolloutWriter, failures_path, metrics_path
from nemo_gym_env.rollouts.report import Progress, write_metrics
from nemo_gym_env.rollouts.reverify import (
    change_table,
    check_input,
    compare,
    gymnasium_servers,
    input_servers,
    iter_input,
    line_ranges,
    reverify_rows,
)
from nemo_gym_env.system.processes import sigterm_raises

__all__ = ["cmd_reverify", "default_output", "reverify_arguments"]


def reverify_arguments(p: argparse.ArgumentParser) -> None:
    """``reverify``'s arguments."""
    describe(p, "Send every row's verify body (the task row and the episode it stores) to /verify again, "
             "with no policy call, and write the new rows (the new verdict, the old identity) to -o (default "
             "<stem>_reverified.jsonl); print, per server, the rows whose reward moved and the mean reward before and "
             "after. Servers are launched as `rollouts` launches them (the servers the rows name, bundled NAMEs, "
             "+config_paths=[...]) or already running (--server-url, --head-url). --resume continues after a kill.",
             "reverify results/rollouts.jsonl",
             "reverify results/rollouts.jsonl -o results/fixed.jsonl --server-url http://127.0.0.1:8000",
             "reverify results/rollouts.jsonl -o results/fixed.jsonl --resume")
    p.add_argument("rollouts", metavar="ROLLOUTS.jsonl", help="a rollouts file")
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    p.add_argument("--output", "-o", metavar="PATH", help="where the new rows go (default <stem>_reverified.jsonl)")
    p.add_argument("--server-url", metavar="URL", help="one running resources server for every row")
    p.add_argument("--head-url", metavar="URL", help="the servers of a running head server (GET /servers)")
    p.add_argument("--concurrency", type=int, default=32, metavar="N", help="verifications in flight (default 32)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="/verify timeout (default 300 s)")
    p.add_argument("--resume", action="store_true", help="continue the output: skip rows already re-verified")
    p.add_argument("--log-dir", metavar="DIR", help="keep the logs of launched servers here")
    add_env_yaml(p)


def default_output(path: str | Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_reverified.jsonl``."""
    path = Path(path)
    return path.with_name(path.stem + "_reverified.jsonl")


def _route(targets: dict[str, str], others: set[str] = frozenset()):
    """Each row's server among ``targets`` (the only one for rows that name none), or among ``others``
    (servers whose rows are skipped, not started)."""
    only = next(iter(targets)) if len(targets) == 1 else None

    def route(row) -> str:
        name = server_of(row)
        if name in targets or name in others:
            return name
        if only is not None:
            return only
        raise UsageError(f"a row names server {name!r}, which is none of {', '.join(targets)}")

    return route


def cmd_reverify(args: argparse.Namespace) -> int:
    """Re-verify every row of a rollouts file; write the new rows; print what changed."""
    source = Path(args.rollouts)
    output = Path(args.output) if args.output else default_output(source)
    if output.resolve() == source.resolve():
        raise UsageError("the output is the input file; write the re-verified rows to another -o/--output")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1, got {args.concurrency}")
    total = check_input(source)
    names, overrides = split_targets(args.targets)
    per_server, rows_played = input_servers(source)
    stopped: list[int] = []
    played: set[str] = set()  # Gymnasium-protocol servers known from their rows: skipped, never started
    if args.server_url or args.head_url:
        servers = ServerSet.of(names, server_url=args.server_url, head_url=args.head_url)
    else:
        configured = any("config_paths" in o for o in overrides)
        # The servers the rows name, unless the command names them (or a config brings them).
        wanted = names or ([] if configured else sorted(n for n in per_server if n))
        if not wanted and not configured:
            raise UsageError("the rows name no server (agent_ref); name one, or give --server-url")
        played = rows_played
        servers = ServerSet.launching([n for n in wanted if n not in played], overrides, env_yaml=env_yaml_path(args))
    try:
        started = [s.name for s in servers if s.name not in played and s.url is None]
        targets = servers.start(started, log_dir=args.log_dir)
        if started:
            say(f"started {len(started)} server(s): {', '.join(started)}")
        route = _route(targets, played)
        for name in per_server:  # every row has a server before anything is written
            route({"agent_ref": {"name": name}} if name else {})
        clients = {n: ResourcesClient(u, timeout_s=args.timeout, verify_timeout_s=args.timeout) for n, u in targets.items()}
        skip = asyncio.run(gymnasium_servers(clients)) | played
        if skip:
            lines = {n: [number for number, row in iter_input(source) if route(row) == n] for n in sorted(skip)}
            total -= sum(len(v) for v in lines.values())
            for name, numbers in lines.items():
                say(f"skipping {len(numbers)} row(s) of {name} (lines {line_ranges(numbers)} of {source}): a "
                    "Gymnasium-protocol server (/reset + /step) has no /verify; its reward is the sum of the "
                    "game's step rewards, which only replaying the game would give")
        with sigterm_raises(), RolloutWriter(output, resume=args.resume) as writer:
            if writer.torn_bytes:
                say(f"dropped a torn last line ({writer.torn_bytes} bytes) of {output} left by an interrupted run")
            if args.resume:
                say(f"resuming {output}: {writer.resumed_rows} row(s) already there")
            progress = Progress(total, initial=writer.resumed_rows, label="reverify")
            try:
                asyncio.run(reverify_rows(source, route, clients, writer, concurrency=args.concurrency,
                                          on_row=progress.update, skip=skip))
            finally:
                progress.close()
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Stopped
        stopped.append(exc.signum if isinstance(exc, Stopped) else signal.SIGINT)
    finally:
        servers.close()
    if stopped:
        say(f"interrupted: {output} holds every finished row; rerun with --resume to finish")
        return 128 + int(stopped[0])
    print(change_table(compare(source, output)))
    summary = write_metrics(output)
    print(f"\nreverified: {output} ({summary['num_rollouts']} rows)\nmetrics:    {metrics_path(output)}")
    if summary["num_failed"]:
        print(f"failures:   {failures_path(output)}")
        say(f"{summary['num_failed']} row(s) could not be re-verified (reasons in {failures_path(output)}); "
            "--resume retries them")
        return 1
    return 0
