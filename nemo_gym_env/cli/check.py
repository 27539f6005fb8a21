"""``nemo-gym-env check TARGET``: check a resources server the way ``check_env`` checks a Gymnasium env.

TARGET (one or more) is a bundled server's name, a hosted env (``gymnasium:FrozenLake-v1``, ``textarena:...``),
a config file (every resources server in it), or the URL of a running server (ours, NeMo Gym's,
anyone's; loopback only unless ``--allow-remote``). Named servers are launched for the check and
stopped after it. The checks and their rules: :mod:`nemo_gym_env.checker.suite`. A table by
default, ``--json`` for CI; the exit code is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nemo_gym_env.checker.report import Report
from nemo_gym_env.checker.suite import CheckSettings, check_server
from nemo_gym_env.cli.common import describe, say
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.errors import UsageError
from nemo_gym_env.system.net import is_loopback

__all__ = ["check_arguments", "cmd_check"]


def check_arguments(p: argparse.ArgumentParser) -> None:
    """``check``'s arguments."""
    defaults = CheckSettings()
    describe(p, "Check a resources server as Gymnasium's check_env checks an env: the protocol, the session "
             "cookie and isolation, the tools as OpenAI function definitions, /verify (or /step) on empty and wrong "
             "trajectories, malformed, oversized and unknown-session requests, NeMo Gym 0.7's session contract where "
             "claimed, and concurrency. Each check passes, warns or fails with its evidence; exit 1 on a fail.",
             "check guess_number", "check gymnasium:FrozenLake-v1 --json", "check my_env/configs/my_env.yaml",
             "check http://127.0.0.1:8000 --input tasks.jsonl")
    p.add_argument("targets", nargs="+", metavar="TARGET",
                   help="bundled name, gymnasium:ID, textarena:GAME, config path or URL (several: each is checked)")
    p.add_argument("--input", "-i", metavar="PATH", help="example rows (JSONL) to play; default: the server's own")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timeout", type=float, default=defaults.timeout_s, metavar="S",
                   help=f"each request's limit (default {defaults.timeout_s:g} s)")
    p.add_argument("--time-limit", type=float, default=defaults.time_limit_s, metavar="S",
                   help=f"the whole check's limit per server (default {defaults.time_limit_s:g} s)")
    p.add_argument("--concurrency", type=int, default=defaults.concurrency, metavar="N",
                   help=f"episodes at once in the concurrency check (default {defaults.concurrency})")
    p.add_argument("--oversized-mb", type=float, default=defaults.oversized_mb, metavar="MB",
                   help=f"size of the oversized body (default {defaults.oversized_mb:g})")
    p.add_argument("--allow-remote", action="store_true", help="allow a URL that is not on this machine")


def _rows(path: str | Path | None, limit: int = 8) -> list[dict[str, Any]]:
    if path is None or not Path(path).is_file():
        return []
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        if len(rows) >= limit:
            break
    return rows


def _launch_targets(target: str) -> list[tuple[Any, list[dict[str, Any]]]]:
    """``(spec, example rows)`` of every resources server a name or config path stands for."""
    from nemo_gym_env.bridge.datasets import example_rows
    from nemo_gym_env.bridge.targets import is_hosted
    from nemo_gym_env.envs.sources import ServerSet

    if target.endswith((".yaml", ".yml")) or Path(target).is_file():
        servers = ServerSet.launching(config_paths=[target], check=False)  # its rows build a hosted env, naming it
    else:
        servers = ServerSet.launching([target])
    found = []
    for server in servers:
        if is_hosted(server.spec):
            rows = example_rows(server.config)
        else:
            rows = _rows(server.examples) if server.examples is not None else []
        found.append((server.spec, rows))
    if not found:
        raise UsageError(f"{target}: no resources server to check")
    return found


def cmd_check(args: argparse.Namespace) -> int:
    """Run the checks; print the reports; 1 when a check failed."""
    settings = CheckSettings(timeout_s=args.timeout, time_limit_s=args.time_limit, concurrency=args.concurrency,
                             oversized_mb=args.oversized_mb)
    if settings.concurrency < 1 or settings.timeout_s <= 0 or settings.time_limit_s <= 0:
        raise UsageError("--concurrency, --timeout and --time-limit must be positive")
    given = _rows(args.input) if args.input else None
    if args.input and not given:
        raise UsageError(f"--input {args.input}: no rows read")
    reports: list[Report] = []
    urls = [t for t in args.targets if t.startswith(("http://", "https://"))]
    for url in urls:
        host = urlsplit(url).hostname or ""
        if not is_loopback(host) and not args.allow_remote:
            raise UsageError(f"{url} is not on this machine; pass --allow-remote to check it anyway")
    launching = [(spec, rows) for t in args.targets if t not in urls for spec, rows in _launch_targets(t)]
    for url in urls:
        reports.append(background_loop().run(check_server(url, given or [], settings)))
    if launching:
        from nemo_gym_env.envs.sources import Server, ServerSet

        with ServerSet(Server(spec.instance_name, spec=spec) for spec, _ in launching) as servers:
            say(f"starting {', '.join(servers.names)} ...")
            urls = servers.start(auto_restart=False)  # a server that dies under the checks is reported, not restarted
            for spec, rows in launching:
                report = background_loop().run(check_server(urls[spec.instance_name], given or rows, settings))
                report.target = f"{spec.instance_name} ({urls[spec.instance_name]})"
                reports.append(report)
    if args.json:
        print(json.dumps([r.as_json() for r in reports] if len(reports) > 1 else reports[0].as_json(), indent=2))
    else:
        print("\n\n".join(r.table() for r in reports))
    return 1 if any(r.failed for r in reports) else 0
