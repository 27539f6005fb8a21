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

This module is the command table and the error handling: each command's module (:mod:`~nemo_gym_env.cli.rollouts`,
:mod:`~nemo_gym_env.cli.serve`, :mod:`~nemo_gym_env.cli.tools`, ...) declares its arguments and turns them into the
library's settings, and is imported only when its command runs. Config arguments are NeMo Gym's Hydra overrides
(``+config_paths=[a.yaml,b.yaml]``, ``+key=value``) merged with NeMo Gym's precedence (config
files < env.yaml < command line). Errors are one line on stderr and a non-zero exit;
``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Iterable, Sequence

from nemo_gym_env import __version__
from nemo_gym_env.cli.common import PROG, Parser, say
from nemo_gym_env.errors import NemoGymError

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("nemo_gym_env.cli.serve", "start servers and a head server (like ng_run)"),
    "rollouts": ("nemo_gym_env.cli.rollouts", "collect rollouts (like ng_collect_rollouts)"),
    "reverify": ("nemo_gym_env.cli.reverify", "re-verify stored rollouts against the current servers (no policy)"),
    "view": ("nemo_gym_env.cli.view", "open rollout files in a local web page"),
    "play": ("nemo_gym_env.cli.view", "play an environment by hand in a local web page"),
    "check": ("nemo_gym_env.cli.check", "check a resources server: protocol, sessions, tools, bad input, concurrency"),
    "list": ("nemo_gym_env.cli.tools", "the bundled servers, env ids and tools"),
    "config": ("nemo_gym_env.cli.tools", "print the merged config (secrets redacted)"),
    "validate": ("nemo_gym_env.cli.tools", "check dataset rows"),
    "init": ("nemo_gym_env.cli.tools", "scaffold a new resources server"),
}
"""Each command: the module that owns it (``<command>_arguments(parser)`` and ``cmd_<command>(args)``) and its line
in ``--help``. A command's module is imported only when that command is named, so ``--help`` imports none."""


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top-level options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The ``nemo-gym-env`` argument parser; the arguments of ``commands`` (default: every command) filled in by
    their modules, the others listed by name and help line only."""
    filled = set(COMMANDS if commands is None else commands)
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
    for name, (module, line) in COMMANDS.items():
        p = sub.add_parser(name, parents=[common], help=line, description=line)
        if name in filled:
            owner = importlib.import_module(module)
            getattr(owner, f"{name}_arguments")(p)
            p.set_defaults(run=getattr(owner, f"cmd_{name}"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    named = _command_of(argv)
    try:  # the named command's module is imported here: an install that lacks what it needs gets one line
        parser = build_parser([named] if named in COMMANDS else [])
    except Exception as exc:  # noqa: BLE001 - as every other error
        return _report(exc, "--debug" in argv)
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
    here = os.path.abspath(os.curdir)  # modules of the folder the command runs from import, after installed ones
    if here not in sys.path:
        sys.path.append(here)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as errors.Stopped
        say("interrupted")
        return 128 + getattr(exc, "signum", 2)
    except Exception as exc:  # noqa: BLE001 - every error becomes one line (tracebacks with --debug)
        return _report(exc, debug)


def _report(exc: Exception, debug: bool) -> int:
    """An error as one line on stderr (the traceback too with ``--debug``); the exit code, 1."""
    if debug:
        traceback.print_exception(exc)
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
