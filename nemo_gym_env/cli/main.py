"""``nemo-gym-env``: serve resources servers, collect rollouts, scaffold and check, from one command.

NeMo Gym's ``ng_run`` / ``ng_collect_rollouts`` jobs, starting in seconds with no network::

    nemo-gym-env rollouts                                   # the bundled judged servers, the local model
    nemo-gym-env rollouts --policy openai                   # the endpoint of env.yaml
    nemo-gym-env serve example_multi_step                   # servers + head server on :11000
    nemo-gym-env serve "+config_paths=[my_env/configs/my_env.yaml]" +head_server.port=0
    nemo-gym-env rollouts --head-url http://127.0.0.1:11000 --input tasks.jsonl --policy openai
    nemo-gym-env list | config NAME | validate tasks.jsonl | init my_env
    nemo-gym-env check guess_number | gymnasium:FrozenLake-v1 | http://127.0.0.1:8000   # is a server right?
    nemo-gym-env view results/rollouts.jsonl | play example_multi_step   # local web pages

This module is argparse only: each command's module (:mod:`~nemo_gym_env.cli.rollouts`,
:mod:`~nemo_gym_env.cli.serve`, :mod:`~nemo_gym_env.cli.tools`) turns the arguments into the
library's settings and calls it. Config arguments are NeMo Gym's Hydra overrides
(``+config_paths=[a.yaml,b.yaml]``, ``+key=value``) merged with NeMo Gym's precedence (config
files < env.yaml < command line). Errors are one line on stderr and a non-zero exit;
``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import sys
import textwrap
import traceback
from collections.abc import Sequence

from nemo_gym_env import __version__
from nemo_gym_env.cli.check import add_check_parser
from nemo_gym_env.cli.common import PROG, Parser, add_env_yaml, say
from nemo_gym_env.errors import NemoGymError
from nemo_gym_env.policies.factory import LOCAL_DTYPES, POLICY_KINDS
from nemo_gym_env.rollouts.settings import (
    DEFAULT_CONCURRENCY,
    ENDPOINT_DEFAULTS,
    LOCAL_DEFAULTS,
    RolloutSettings,
)

__all__ = ["build_parser", "main"]

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RolloutSettings)}


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=100)


def _add_listen(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: a free one)")


def build_parser() -> argparse.ArgumentParser:
    """The ``nemo-gym-env`` argument parser."""
    common = Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs")
    parser = Parser(
        prog=PROG,
        parents=[common],
        description="NeMo-Gym-style resources servers: serve them, collect rollouts, scaffold and check.",
        epilog=f"`{PROG} rollouts` with no arguments: the example tasks of every bundled server that judges its "
        "episodes (hosted envs run when named) with the local model.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser(
        "serve",
        parents=[common],
        help="start servers and a head server (like ng_run)",
        description=_wrap("Start resources servers standalone, plus a head server (default 127.0.0.1:11000; "
        "+head_server.port=0 for a free port) serving GET /servers and GET /global_config_dict_yaml "
        "(secrets redacted). Ctrl-C or SIGTERM stops everything."),
        epilog=f'examples:\n  {PROG} serve example_multi_step\n  {PROG} serve "+config_paths=[a.yaml,b.yaml]" '
        f"+head_server.port=0\n  {PROG} serve example_multi_step --mcp        # MCP clients at <url>/mcp",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    p.set_defaults(run="nemo_gym_env.cli.serve:cmd_serve")

    p = sub.add_parser(
        "rollouts",
        parents=[common],
        help="collect rollouts (like ng_collect_rollouts)",
        description=_wrap("Run each task of a JSONL dataset through a policy against resources servers and write one "
        "row per rollout (NeMo Gym's format: the /verify reply plus _ng_task_index and _ng_rollout_index). "
        "Servers are launched by the command (bundled NAMEs, +config_paths=[...], or, when none is named, every "
        "bundled server that judges its episodes: the hosted Gymnasium and TextArena envs run when named) or already running (--head-url, --server-url)."),
        epilog=f"examples:\n  {PROG} rollouts\n  {PROG} rollouts --policy openai            # endpoint from env.yaml\n"
        f"  {PROG} rollouts example_multi_step --policy scripted --num-repeats 4\n"
        f"  {PROG} rollouts --head-url http://127.0.0.1:11000 --input tasks.jsonl --policy openai --resume",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    where = p.add_argument_group("servers and data")
    where.add_argument("--server", action="append", metavar="NAME", help="a server to use (repeatable); its example data by default")
    where.add_argument("--head-url", metavar="URL", help="use the servers of a running head server (GET /servers)")
    where.add_argument("--server-url", metavar="URL", help="use one running resources server")
    where.add_argument("--input", "-i", metavar="PATH", help="tasks JSONL (NeMo Gym rows); default: the servers' example data")
    where.add_argument("--output", "-o", metavar="PATH", default=_DEFAULTS["output"], help=f"output JSONL (default {_DEFAULTS['output']})")
    where.add_argument("--limit", type=int, metavar="N", help="only the first N valid tasks of each dataset")
    where.add_argument("--strict", action="store_true", help="stop on an invalid row instead of skipping it")
    where.add_argument("--log-dir", metavar="DIR", help="keep the logs of launched servers here")
    add_env_yaml(where)
    pol = p.add_argument_group("policy")
    pol.add_argument("--policy", choices=POLICY_KINDS, help="default: local when torch is installed")
    pol.add_argument("--model", metavar="NAME", help="model name (openai) or path/id (local); env.yaml: policy_model_name")
    pol.add_argument("--base-url", metavar="URL", help="OpenAI-compatible endpoint; env.yaml: policy_base_url")
    pol.add_argument("--api-key", metavar="KEY", help="API key; env.yaml: policy_api_key (safer than the command line)")
    pol.add_argument("--api", choices=("responses", "chat"), default=_DEFAULTS["api"],
                     help="openai: the Responses API (default) or Chat Completions")
    pol.add_argument("--device", metavar="DEV", help="local: cpu (default), cuda or cuda:N")
    pol.add_argument("--dtype", choices=LOCAL_DTYPES,
                     help="local: the weights' dtype (default auto: bfloat16 where the CPU or GPU computes it natively, "
                          "else float32); int8: bfloat16 with int8 weights for decoding, on the CPU")
    pol.add_argument("--seed", type=int, help="local: makes sampling reproducible")
    pol.add_argument("--temperature", type=float,
                     help=f"override responses_create_params.temperature (local: {LOCAL_DEFAULTS['temperature']:g}, greedy)")
    pol.add_argument("--top-p", type=float, help="override responses_create_params.top_p")
    pol.add_argument("--max-output-tokens", type=int, metavar="N",
                     help=f"override responses_create_params.max_output_tokens (local: {LOCAL_DEFAULTS['max_output_tokens']})")
    run = p.add_argument_group("run")
    run.add_argument("--num-repeats", type=int, default=_DEFAULTS["num_repeats"], metavar="N", help=f"rollouts per task (default {_DEFAULTS['num_repeats']})")
    run.add_argument("--concurrency", type=int, metavar="N",
                     help=f"rollouts in flight (default {DEFAULT_CONCURRENCY}; {LOCAL_DEFAULTS['concurrency']} with the local policy)")
    run.add_argument("--max-steps", type=int, default=_DEFAULTS["max_steps"], metavar="N", help=f"model turns per episode (default {_DEFAULTS['max_steps']})")
    run.add_argument("--max-episode-tokens", type=int, metavar="N",
                     help="generated tokens an episode may use; then it is scored as it stands "
                          f"(default: none; local: {LOCAL_DEFAULTS['max_episode_tokens']})")
    run.add_argument("--timeout", type=float, default=_DEFAULTS["timeout"], metavar="S", help=f"server request timeout (default {_DEFAULTS['timeout']:g} s)")
    run.add_argument("--attempt-timeout", type=float, metavar="S",
                     help=f"openai: each HTTP attempt's timeout (default {ENDPOINT_DEFAULTS['attempt_timeout']:g} s); "
                          "timed-out attempts are retried within the turn's deadline")
    run.add_argument("--turn-timeout", type=float, metavar="S",
                     help="the deadline of one model turn, retries and their waits included (default: "
                          f"{ENDPOINT_DEFAULTS['turn_timeout']:g} s for openai, none for local and scripted)")
    run.add_argument("--first-reply-timeout", type=float, default=300.0, metavar="S",
                     help="openai: before the first rollout, how long to wait for the endpoint's first reply (a "
                          "server may load its model at its first request); the turn limits apply after it "
                          "(default 300 s; 0: no wait)")
    run.add_argument("--episode-reward", choices=("verify", "sum"), default="verify",
                     help="a row's reward: the /verify reward (default), or sum: plus the tools' step rewards")
    run.add_argument("--resume", action="store_true", help="continue the output file: skip rollouts already in it")
    run.add_argument("--allow-changes", action="store_true",
                     help="with --resume: add rows even if the file was written with other settings "
                          "(repeats, policy, sampling, a changed dataset)")
    p.set_defaults(run="nemo_gym_env.cli.rollouts:cmd_rollouts")

    p = sub.add_parser(
        "reverify",
        parents=[common],
        help="re-verify stored rollouts against the current servers (no policy)",
        description=_wrap("Send every row's verify body (the task row and the episode it stores) to /verify again, "
        "with no policy call, and write the new rows (the new verdict, the old identity) to -o (default "
        "<stem>_reverified.jsonl); print, per server, the rows whose reward moved and the mean reward before and "
        "after. Servers are launched as `rollouts` launches them (the servers the rows name, bundled NAMEs, "
        "+config_paths=[...]) or already running (--server-url, --head-url). --resume continues after a kill."),
        epilog=f"examples:\n  {PROG} reverify results/rollouts.jsonl\n"
        f"  {PROG} reverify results/rollouts.jsonl -o results/fixed.jsonl --server-url http://127.0.0.1:8000\n"
        f"  {PROG} reverify results/rollouts.jsonl -o results/fixed.jsonl --resume",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    p.set_defaults(run="nemo_gym_env.cli.reverify:cmd_reverify")

    p = sub.add_parser(
        "view",
        parents=[common],
        help="open rollout files in a local web page",
        description=_wrap("Serve a local page over rollout JSONL files (and their _failures.jsonl sidecars): the "
        "list (filter, sort), each rollout's conversation, tool calls and verify reply, a task's rollouts side by "
        "side, and the summary that `rollouts` prints. Files still being written are followed. Binds 127.0.0.1."),
        epilog=f"examples:\n  {PROG} view\n  {PROG} view results/rollouts.jsonl other/rollouts.jsonl --port 8080",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help=f"rollout files (default {_DEFAULTS['output']})")
    _add_listen(p)
    p.add_argument("--max-row-mb", type=float, default=16.0, metavar="MB",
                   help="longest line read as a row (default 16); longer ones are listed as errors")
    add_env_yaml(p)
    p.set_defaults(run="nemo_gym_env.cli.view:cmd_view")

    p = sub.add_parser(
        "play",
        parents=[common],
        help="play an environment by hand in a local web page",
        description=_wrap("Serve a local page where a person plays one episode at a time through the same "
        "NemoGymEnv a policy uses: the task's messages, a form per tool, each output, a final answer, then the "
        "reward and the verify reply. A finished episode can be saved as a rollout row. Binds 127.0.0.1."),
        epilog=f"examples:\n  {PROG} play example_multi_step\n"
        f'  {PROG} play "+config_paths=[my_env/configs/my_env.yaml]" --input my_env/data/example.jsonl\n'
        f"  {PROG} play --server-url http://127.0.0.1:8000 --input tasks.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="NAME|+config_paths=[...]", help="a bundled server or a config")
    p.add_argument("--server-url", metavar="URL", help="play a running resources server (with --input)")
    p.add_argument("--input", "-i", metavar="PATH", help="tasks JSONL (default: a bundled server's example data)")
    p.add_argument("--output", "-o", metavar="PATH", default="results/played.jsonl",
                   help="where saved episodes go (default results/played.jsonl)")
    _add_listen(p)
    p.add_argument("--max-steps", type=int, default=64, metavar="N",
                   help="turns before the episode is verified anyway (default 64)")
    add_env_yaml(p)
    p.set_defaults(run="nemo_gym_env.cli.view:cmd_play")

    add_check_parser(sub, common)

    p = sub.add_parser("list", parents=[common], help="the bundled servers, env ids and tools",
                       description="List the bundled servers: env ids, example tasks, tools.")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.set_defaults(run="nemo_gym_env.cli.tools:cmd_list")

    p = sub.add_parser(
        "config",
        parents=[common],
        help="print the merged config (secrets redacted)",
        description=_wrap("Print the merged, resolved config as YAML with every secret redacted."),
        epilog=f'examples:\n  {PROG} config example_multi_step\n  {PROG} config "+config_paths=[a.yaml]" +key=value',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    add_env_yaml(p)
    p.set_defaults(run="nemo_gym_env.cli.tools:cmd_config")

    p = sub.add_parser("validate", parents=[common], help="check dataset rows",
                       description="Check every row of JSONL datasets; report offending lines; exit 1 if any.")
    p.add_argument("datasets", nargs="+", metavar="DATASET", help="JSONL files")
    p.set_defaults(run="nemo_gym_env.cli.tools:cmd_validate")

    p = sub.add_parser("init", parents=[common], help="scaffold a new resources server",
                       description="Create NAME/ with app.py, configs/NAME.yaml, data/example.jsonl (5 rows), "
                       "tests/test_app.py and README.md.")
    p.add_argument("name", metavar="NAME", help="server name (a Python identifier)")
    p.add_argument("--dir", default=".", metavar="PATH", help="where to create NAME/ (default: here)")
    p.set_defaults(run="nemo_gym_env.cli.tools:cmd_init")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    # argparse fills a nargs="*" positional once, so names and +key=value overrides written
    # after an option come back as leftovers: they belong to the command's targets.
    args, leftovers = parser.parse_known_args(argv)
    if leftovers:
        if hasattr(args, "targets") and not any(item.startswith("-") for item in leftovers):
            args.targets = [*(args.targets or []), *leftovers]
        else:
            parser.error(f"unrecognized arguments: {' '.join(leftovers)}")
    debug = bool(getattr(args, "debug", False))
    args.debug = debug
    if debug:  # the servers this command starts print their tracebacks too
        os.environ["NEMO_GYM_ENV_DEBUG"] = "1"
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING, format=f"{PROG}: %(levelname)s %(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return 2
    module, _, function = args.run.partition(":")
    here = os.path.abspath(os.curdir)  # modules of the folder the command runs from import, after installed ones
    if here not in sys.path:
        sys.path.append(here)
    try:
        # A command's module is imported only when it runs, so `--help` and `list` stay quick.
        return int(getattr(importlib.import_module(module), function)(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as errors.Stopped
        say("interrupted")
        return 128 + getattr(exc, "signum", 2)
    except Exception as exc:  # noqa: BLE001 - every error becomes one line (tracebacks with --debug)
        if debug:
            traceback.print_exc()
        message = str(exc) or type(exc).__name__
        if not isinstance(exc, NemoGymError):
            message = f"{type(exc).__name__}: {message}"
        first, _, rest = message.partition("\n")
        say(f"error: {first}")
        if rest:  # e.g. a crashed server's last log lines
            print("\n".join(f"  | {line}" for line in rest.splitlines()), file=sys.stderr)
        if not debug and not isinstance(exc, NemoGymError):
            say("(run with --debug for the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
