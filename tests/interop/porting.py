"""The port of a NeMo Gym resources server to nemo_gym_env (docs/porting.md), as code.

A server written for NeMo Gym imports its base classes from ``nemo_gym.base_resources_server``
and ``SESSION_ID_KEY`` from ``nemo_gym.server_utils``; ``nemo_gym_env.server`` exports all of
them, so renaming those two modules on the import lines is the whole port.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..fixtures import fixture_server

__all__ = ["FIXTURE", "MODULE_RENAMES", "port_folder", "port_source"]

FIXTURE = fixture_server("ng_style_server")
"""The NeMo-Gym-style server the tests port."""

MODULE_RENAMES = {
    "nemo_gym.base_resources_server": "nemo_gym_env.server",
    "nemo_gym.server_utils": "nemo_gym_env.server",
}
"""NeMo Gym's module -> ours."""

_IMPORT_LINE = re.compile(r"^\s*(from\s+\S+\s+import\b|import\s+\S+)")


def port_source(source: str) -> str:
    """Rename NeMo Gym's modules on the import lines of ``source``; nothing else changes."""
    lines = []
    for line in source.splitlines(keepends=True):
        if _IMPORT_LINE.match(line):
            for theirs, ours in MODULE_RENAMES.items():
                line = re.sub(rf"\b{re.escape(theirs)}\b", ours, line)
        lines.append(line)
    return "".join(lines)


def port_folder(source: Path, target: Path) -> Path:
    """Copy a server folder to ``target`` with its ``app.py`` ported; returns ``target``."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
    (target / "app.py").write_text(port_source((source / "app.py").read_text()))
    return target
