"""The resources servers bundled with the package.

A bundled server is a folder of the installed ``nemo_gym_env.servers`` package holding
``app.py``, ``configs/<name>.yaml`` (NeMo Gym's config format) and ``data/example.jsonl``::

    from nemo_gym_env.launch.catalog import bundled_servers, bundled_spec, bundled_dataset

    sorted(bundled_servers())            # ['example_multi_step', ...]
    spec = bundled_spec("example_multi_step")
    rows = bundled_dataset("example_multi_step")

Paths come from the installed package (editable install or wheel), not from a checkout.

Servers that other installed packages declare under the ``nemo_gym_env.servers`` entry-point group
(:mod:`nemo_gym_env.system.plugins`) are names here too, after the bundled ones: everything that takes
a bundled name (``gym.make``, ``serve``, ``rollouts``, ``check``, the trainer recipes) takes theirs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import re
import shutil
from pathlib import Path

from nemo_gym_env.errors import ConfigError, UnknownServerError
from nemo_gym_env.launch.config import ServerSpec, load_config, server_specs
from nemo_gym_env.system.plugins import BUNDLED_PACKAGE, plugin_servers

__all__ = ["SERVERS_PACKAGE", "UnknownServerError", "bundled_config_path", "bundled_dataset", "bundled_servers",
           "bundled_spec", "missing_extra", "missing_program"]

SERVERS_PACKAGE = BUNDLED_PACKAGE
"""Import name of the package holding the bundled server folders."""


def _package_dirs() -> list[Path]:
    try:
        root = importlib.resources.files(SERVERS_PACKAGE)
    except ModuleNotFoundError:
        return []
    if isinstance(root, Path):
        dirs = [root]
    else:  # a namespace package spanning several folders (MultiplexedPath): use its __path__
        dirs = [Path(p) for p in importlib.import_module(SERVERS_PACKAGE).__path__]
    return [d for d in dirs if d.is_dir()]


def bundled_servers() -> dict[str, Path]:
    """Name -> folder of every bundled server (folders with ``app.py`` and ``configs/<name>.yaml``), then of
    every server an installed package declares (a plugin: see the module docstring)."""
    found: dict[str, Path] = {}
    for root in _package_dirs():
        for folder in sorted(root.iterdir()):
            name = folder.name
            if (
                folder.is_dir()
                and name not in found
                and (folder / "app.py").is_file()
                and (folder / "configs" / f"{name}.yaml").is_file()
            ):
                found[name] = folder
    for name, plugin in plugin_servers().items():
        found.setdefault(name, plugin.folder)
    return found


def _folder(name: str) -> Path:
    servers = bundled_servers()
    if name not in servers:
        available = ", ".join(sorted(servers)) or "none (is the package installed?)"
        raise UnknownServerError(f"no bundled server named {name!r}; available: {available}")
    return servers[name]


def bundled_spec(name: str) -> ServerSpec:
    """The :class:`~nemo_gym_env.launch.config.ServerSpec` of a bundled server, from its own YAML.

    Raises:
        UnknownServerError: If ``name`` is not a bundled server (a ``KeyError``).
        ConfigError: If its YAML does not define exactly one resources server.
    """
    path = bundled_config_path(name)
    specs = server_specs(load_config([path], env_yaml=None))
    if len(specs) != 1:
        raise ConfigError(f"{path} must define exactly one resources server, found {len(specs)}")
    return specs[0]


def bundled_config_path(name: str) -> Path:
    """Path of a bundled server's own config (``configs/<name>.yaml``).

    Raises:
        UnknownServerError: If ``name`` is not a bundled server.
    """
    return _folder(name) / "configs" / f"{name}.yaml"


def bundled_dataset(name: str) -> Path:
    """Path of a bundled server's example tasks (``data/example.jsonl``).

    Raises:
        UnknownServerError: If ``name`` is not a bundled server.
        FileNotFoundError: If the server ships no example data.
    """
    path = _folder(name) / "data" / "example.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"bundled server {name!r} has no example data at {path}")
    return path


_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)[^;]*;.*\bextra\s*==\s*[\"']([^\"']+)[\"']")


def missing_extra(name: str) -> str | None:
    """The extra a bundled server's config ``requires`` (``requires: math``), when it is not installed here.

    An extra counts as installed when every distribution it lists in this package's metadata is;
    the package's own extras (``nemo-gym-env[a]`` inside another) are followed.
    """
    extra = bundled_spec(name).config.get("requires")
    if not extra:
        return None
    try:
        requirements = importlib.metadata.requires("nemo-gym-env") or []
    except importlib.metadata.PackageNotFoundError:  # run from a source tree: nothing to tell
        return None
    def normalized(name: str) -> str:  # PEP 685: how pip compares extras
        return re.sub(r"[-_.]+", "-", name).lower()

    wanted, seen, dists = {normalized(str(extra))}, set(), []
    while wanted - seen:
        current = (wanted - seen).pop()
        seen.add(current)
        for text in requirements:
            match = _REQUIREMENT.match(text)
            if match and normalized(match[2]) == current:
                if normalized(match[1]) == "nemo-gym-env":
                    wanted |= {normalized(e) for e in re.findall(r"[\w.-]+", text[text.index("[") + 1:text.index("]")])}
                else:
                    dists.append(match[1])
    for dist in dists:
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            return str(extra)
    return None


def missing_program(name: str) -> str | None:
    """The first program a bundled server's config ``requires_programs`` (``[git]``) that is not on ``PATH``."""
    for program in bundled_spec(name).config.get("requires_programs") or []:
        if shutil.which(str(program)) is None:
            return str(program)
    return None
