"""Resources servers that other installed packages declare: the ``nemo_gym_env.servers`` entry-point group.

A package publishes a server as Gymnasium's ``gymnasium.envs`` group publishes envs: an entry point whose
name is the server's name and whose value is the import path of a server package laid out as
``nemo-gym-env init NAME`` writes it (``app.py``, ``configs/NAME.yaml``, ``data/example.jsonl``)::

    [project.entry-points."nemo_gym_env.servers"]
    echo_env = "my_package.echo_env"

Once the package is installed, the name works as a bundled one does (``gym.make("NemoGym/echo_env-v0")``,
``serve``, ``rollouts``, ``check``, the TRL recipe). Finding the folder imports nothing of the server
(``importlib.util.find_spec``; a parent package's ``__init__`` runs, as any import runs it). A plugin that
cannot be used (its module is missing, it is not a folder, its ``app.py`` or config is missing, its name
is taken) is named in one line on standard error, once a process, and skipped; the others work.
Standard library only.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BUNDLED_PACKAGE", "GROUP", "PluginServer", "plugin_servers"]

GROUP = "nemo_gym_env.servers"
"""The entry-point group a package declares its servers under."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class PluginServer:
    """A server another package declares: its name, its import path, its folder and the distribution."""

    name: str
    module: str
    folder: Path
    distribution: str


BUNDLED_PACKAGE = "nemo_gym_env.servers"
"""Where the bundled servers live: a plugin may not take one of their names."""


@functools.lru_cache(maxsize=1)
def plugin_servers() -> dict[str, PluginServer]:
    """Name -> :class:`PluginServer` of every usable plugin (found once a process; see the module docstring)."""
    found: dict[str, PluginServer] = {}
    for point in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda p: p.name):
        dist = point.dist.name if point.dist is not None else "an unknown distribution"
        folder, why = None, _problem(point.name, point.value, found)
        if why is None:
            folder, why = _locate(point.name, point.value)
        if why is not None or folder is None:
            print(f"nemo-gym-env: skipping the server plugin {point.name!r} ({point.value} from {dist}): {why}",
                  file=sys.stderr)
            continue
        found[point.name] = PluginServer(point.name, point.value, folder, dist)
    return found


def _problem(name: str, value: str, found: dict[str, PluginServer]) -> str | None:
    if not _NAME.fullmatch(name):
        return "its name is not letters, digits and underscores"
    if _bundled(name):
        return "a bundled server has that name"
    if name in found:
        return f"{found[name].distribution} declares that name too"
    if ":" in value:
        return "its value must be a package's import path, not module:attribute"
    return None


def _bundled(name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{BUNDLED_PACKAGE}.{name}") is not None
    except ImportError:
        return False


def _locate(name: str, module: str) -> tuple[Path | None, str | None]:
    """The server package's folder, or why there is none."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        return None, f"it does not import ({type(exc).__name__}: {exc})"
    if spec is None:
        return None, f"no module named {module!r} is installed"
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        return None, "it is a module, not a server package (a folder)"
    folder = Path(locations[0])
    missing = [part for part in ("app.py", f"configs/{name}.yaml") if not (folder / part).is_file()]
    if missing:
        return None, f"{folder} lacks {' and '.join(missing)}"
    return folder, None
