"""What a launched server runs: its entrypoint script, found as NeMo Gym finds it, and the import
path its process needs to import the same ``nemo_gym_env`` as its launcher."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from nemo_gym_env.errors import LaunchError

if TYPE_CHECKING:
    from nemo_gym_env.launch.config import ServerSpec

__all__ = ["BRIDGE_APPS", "child_pythonpath", "resolve_entrypoint"]

BRIDGE_APPS = {"gymnasium_env": "gymnasium_app.py", "textarena_game": "textarena_app.py"}
"""Implementations served by ``nemo_gym_env.bridge``'s apps (``bridge/apps/``) when the config's folder has
no app of its own: a hosted env's config block names only its env."""


def resolve_entrypoint(spec: ServerSpec) -> Path:
    """The absolute path of a spec's ``entrypoint`` script.

    A relative entrypoint is looked up in the server folder (the YAML's folder, or its parent
    when the YAML lives in ``configs/``), then in NeMo Gym's layout
    ``<gym root>/resources_servers/<impl_name>/`` next to the YAML and in the current directory;
    the implementations ``gymnasium_env`` and ``textarena_game`` then fall back to the bridge's
    apps (a hosted env's config block needs no app file).

    Raises:
        LaunchError: If no candidate exists; the message lists every path tried.
    """
    entry = Path(str(spec.config.get("entrypoint") or "app.py")).expanduser()
    if entry.is_absolute():
        candidates = [entry]
    else:
        candidates = []
        if spec.config_dir is not None:
            cdir = Path(spec.config_dir)
            candidates.append((cdir.parent if cdir.name == "configs" else cdir) / entry)
            for root in (cdir, cdir.parent):
                candidates.append(root / "resources_servers" / spec.impl_name / entry)
        candidates.append(Path.cwd() / "resources_servers" / spec.impl_name / entry)
    for candidate in dict.fromkeys(candidates):
        if candidate.is_file():
            return candidate.resolve()
    hosted = BRIDGE_APPS.get(spec.impl_name)
    if hosted is not None and not entry.is_absolute():  # a hosted env's block: the bridge's app serves it
        return (Path(__file__).resolve().parents[1] / "bridge" / "apps" / hosted).resolve()
    tried = "\n  ".join(str(c) for c in dict.fromkeys(candidates))
    raise LaunchError(
        f"entrypoint {str(entry)!r} of server {spec.instance_name!r} not found; tried:\n  {tried}\n"
        "Set 'entrypoint' to a path relative to the server folder (the folder holding configs/)."
    )


def child_pythonpath(existing: str | None) -> str:
    """``PYTHONPATH`` for a child server: the folder holding this nemo_gym_env first, unless it is site-packages;
    then the caller's own entries, made absolute (the child runs in its server's folder, not the caller's);
    last, the caller's folder, so ``module:Class`` targets, formatters and verifiers of the folder a command
    runs from import in the server as they do in the caller (as ``python`` finds them there).

    So a child started from a checkout (tests, development) imports the same nemo_gym_env as
    this process, installed or not.
    """
    root = Path(__file__).resolve().parents[2]  # the folder holding the nemo_gym_env package
    here = os.getcwd()
    parts = [os.path.abspath(part) if part else here for part in (existing.split(os.pathsep) if existing else [])]
    if root.name not in ("site-packages", "dist-packages"):
        parts.insert(0, str(root))
    if here not in parts:
        parts.append(here)
    return os.pathsep.join(parts)
