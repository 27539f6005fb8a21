"""The command line, ``nemo-gym-env``: argparse in :mod:`~nemo_gym_env.cli.main`, one module per command."""

from __future__ import annotations

from nemo_gym_env.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
