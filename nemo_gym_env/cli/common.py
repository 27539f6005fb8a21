"""What every command shares: the program name, one-line messages, argument helpers."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

from nemo_gym_env.launch.config import DEFAULT_ENV_YAML

__all__ = ["PROG", "Parser", "add_env_yaml", "add_listen", "describe", "env_yaml_path", "say", "split_targets", "wrap"]

PROG = "nemo-gym-env"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def wrap(text: str) -> str:
    """A command's description, wrapped for ``--help``."""
    return textwrap.fill(text, width=100)


def describe(parser: argparse.ArgumentParser, description: str, *examples: str) -> None:
    """A command's ``--help`` text: its description, wrapped, and its examples as written."""
    parser.description = wrap(description)
    if examples:
        parser.epilog = "examples:\n" + "\n".join(f"  {PROG} {example}" for example in examples)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter


def say(message: str) -> None:
    """One line for the person at the terminal, on stderr (stdout carries results)."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def split_targets(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """Positional arguments -> (bundled server names, Hydra overrides)."""
    names, overrides = [], []
    for item in items:
        (overrides if "=" in item or item.startswith("~") else names).append(item)
    return names, overrides


def add_env_yaml(parser: Any) -> None:
    """``--env-yaml PATH`` and ``--no-env-yaml`` on a parser or an argument group."""
    parser.add_argument("--env-yaml", metavar="PATH",
                        help="env file with secrets and globals (default: ./env.yaml if present)")
    parser.add_argument("--no-env-yaml", action="store_true", help="ignore ./env.yaml")


def add_listen(parser: argparse.ArgumentParser) -> None:
    """``--host`` and ``--port`` of a command that serves a page."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: a free one)")


def env_yaml_path(args: argparse.Namespace) -> str | None:
    """The env file a command reads: ``--env-yaml``, ``./env.yaml``, or none with ``--no-env-yaml``."""
    if getattr(args, "no_env_yaml", False):
        return None
    return getattr(args, "env_yaml", None) or DEFAULT_ENV_YAML
