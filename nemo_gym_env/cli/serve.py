"""``nemo-gym-env serve``: servers and a head server, standalone, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time

from nemo_gym_env.cli.common import PROG, add_env_yaml, describe, env_yaml_path, say, split_targets
from nemo_gym_env.envs.sources import ServerSet
from nemo_gym_env.errors import UsageError
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers
from nemo_gym_env.launch.config import ServerSpec, other_instances
from nemo_gym_env.launch.head_server import HeadServer, head_address
from nemo_gym_env.system.net import is_loopback
from nemo_gym_env.system.processes import sigterm_raises

__all__ = ["cmd_serve", "with_mcp"]


def serve_arguments(p: argparse.ArgumentParser) -> None:
    """``serve``'s arguments."""
    describe(p, "Start resources servers standalone, plus a head server (default 127.0.0.1:11000; "
             "+head_server.port=0 for a free port) serving GET /servers and GET /global_config_dict_yaml "
             "(secrets redacted). Ctrl-C or SIGTERM stops everything.",
             "serve example_multi_step", 'serve "+config_paths=[a.yaml,b.yaml]" +head_server.port=0',
             "serve example_multi_step --mcp        # MCP clients at <url>/mcp")
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    p.add_argument("--log-dir", metavar="DIR", help="keep server logs here (default: a temporary folder)")
    p.add_argument("--mcp", action="store_true",
                   help="also serve each resources server's tools over MCP at <url>/mcp (needs the mcp extra; "
                        "a bundled server's example tasks are the task list MCP clients name by index)")
    add_env_yaml(p)
    p.add_argument("--http", choices=("auto", "httptools", "h11"),
                   help="every server's HTTP parser (default: each server's `http`, auto: httptools where it imports)")
    p.add_argument("--loop", choices=("asyncio", "uvloop", "auto"),
                   help="every server's event loop (default: each server's `loop`, asyncio unless it says)")


def cmd_serve(args: argparse.Namespace) -> int:
    """Start servers and the head server; run until Ctrl-C or SIGTERM."""
    names, overrides = split_targets(args.targets)
    servers = ServerSet.launching(names, overrides, env_yaml=env_yaml_path(args))
    cfg = servers.cfg
    if not servers:
        raise UsageError(
            "nothing to serve: name bundled servers (see `nemo-gym-env list`) or pass \"+config_paths=[...]\""
        )
    chosen = {key: value for key in ("http", "loop") if (value := getattr(args, key, None))}
    for server in servers:
        spec = with_mcp(server.spec) if getattr(args, "mcp", False) else server.spec
        server.spec = dataclasses.replace(spec, config={**spec.config, **chosen})
    for name, stype in other_instances(cfg):
        say(f"not starting {name!r} ({stype}): nemo-gym-env plays the agent and the model itself (`rollouts`)")
    host, port = head_address(cfg)
    if not is_loopback(host):
        say(f"warning: the head server listens on {host}, reachable from the network (secrets stay redacted)")
    started = time.monotonic()
    with sigterm_raises():
        head = None
        try:
            head = HeadServer(cfg, host=host, port=port)  # bind first: a taken port fails fast
            servers.start(stream_logs=True, log_dir=args.log_dir)
            running = servers.launcher.servers
            head.processes = [running[name] for name in servers.names]
            head.start()
            elapsed = time.monotonic() - started
            width = max(len("head_server"), *(len(p.name) for p in head.processes))
            lines = [f"{PROG}: {len(head.processes)} server(s) ready in {elapsed:.2f} s"]
            mcp = "  (MCP: {}/mcp)" if getattr(args, "mcp", False) else ""
            lines += [f"  {p.name:<{width}}  {p.url}{mcp.format(p.url)}" for p in head.processes]
            lines.append(f"  {'head_server':<{width}}  {head.url}  (GET /servers, GET /global_config_dict_yaml)")
            lines.append(f"logs: {servers.launcher.log_dir}" + ("" if args.log_dir else " (removed on exit)"))
            lines.append(f"rollouts against them: {PROG} rollouts --head-url {head.url} --policy ...")
            lines.append("Ctrl-C to stop.")
            print("\n".join(lines), flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM as Stopped
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the stopping finish (bounded: 5 s per server)
            print(f"{PROG}: stopping", file=sys.stderr, flush=True)
            return 0
        finally:
            if head is not None:
                head.stop()
            servers.close()


def with_mcp(spec: ServerSpec) -> ServerSpec:
    """``spec`` serving its tools over MCP too; a bundled server's example tasks as its MCP task list."""
    config = {**spec.config, "expose_tools_over_mcp": True}
    bundled = bundled_servers()
    name = next((n for n in (spec.instance_name, spec.impl_name) if n in bundled), None)
    if not config.get("mcp_tasks") and name is not None:
        try:
            config["mcp_tasks"] = str(bundled_dataset(name))
        except FileNotFoundError:
            pass
    return dataclasses.replace(spec, config=config)
