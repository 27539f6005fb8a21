"""How the package's public names are reached: lazily, and under the paths they used to have.

Two mechanisms, both standard-library only (a server process imports this before anything else):

- :func:`lazy_exports`: a package's ``__init__`` lists which submodule defines each public name,
  and the name is imported on first access. Importing ``nemo_gym_env.protocol.keys`` then does
  not import openai's types, and ``nemo_gym_env.NemoGymEnv`` does not import the env stack
  until it is used.
- :data:`MOVED` and :func:`install_moved_modules`: modules that lived at the top of the package
  before it was organised into one folder per side (``nemo_gym_env.types``, ``.config``, ...)
  still import under their old names; each old name is the new module itself, not a copy.

Example:
    >>> import nemo_gym_env.types, nemo_gym_env.protocol.types
    >>> nemo_gym_env.types is nemo_gym_env.protocol.types
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "install_moved_modules", "lazy_exports"]


def lazy_exports(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for a package whose public names live in its submodules.

    Args:
        package: The package's ``__name__``.
        table: Public name -> the absolute module that defines it.

    Example (a package ``__init__``)::

        __getattr__, __dir__ = lazy_exports(__name__, {"Launcher": "nemo_gym_env.launch.launcher"})
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *table})

    return __getattr__, __dir__


MOVED: dict[str, str] = {
    "nemo_gym_env.types": "nemo_gym_env.protocol.types",
    "nemo_gym_env.dataset": "nemo_gym_env.protocol.dataset",
    "nemo_gym_env.metrics": "nemo_gym_env.protocol.metrics",
    "nemo_gym_env.parser": "nemo_gym_env.protocol.parser",
    "nemo_gym_env.loop": "nemo_gym_env.client.loop",
    "nemo_gym_env.sessions": "nemo_gym_env.server.sessions",
    "nemo_gym_env.serving": "nemo_gym_env.server.serving",
    "nemo_gym_env.workers": "nemo_gym_env.server.workers",
    "nemo_gym_env.testing": "nemo_gym_env.server.testing",
    "nemo_gym_env.scripting": "nemo_gym_env.server.scripting",
    "nemo_gym_env.scaffold": "nemo_gym_env.server.scaffold",
    "nemo_gym_env.config": "nemo_gym_env.launch.config",
    "nemo_gym_env.catalog": "nemo_gym_env.launch.catalog",
    "nemo_gym_env.head": "nemo_gym_env.launch.head",
    "nemo_gym_env.actions": "nemo_gym_env.envs.actions",
    "nemo_gym_env.episode": "nemo_gym_env.envs.episode",
    "nemo_gym_env.env": "nemo_gym_env.envs.env",
    "nemo_gym_env.vector": "nemo_gym_env.envs.vector",
    "nemo_gym_env.spaces": "nemo_gym_env.envs.spaces",
    "nemo_gym_env.registration": "nemo_gym_env.envs.registration",
}
"""Old module path -> the module that took its place (``nemo_gym_env.server``, ``.client``,
``.launch``, ``.rollouts`` and ``.cli`` became packages of the same name)."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module that took its place."""

    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # The old name becomes a second key in sys.modules for the very same module object.
        module = importlib.import_module(MOVED[spec.name])
        self._own_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Nothing to run: the module ran when it was imported under its own name. The import
        # system has just set its __spec__ to the old name's; give it back its own.
        module.__spec__ = self._own_specs.pop(module.__name__, module.__spec__)


def install_moved_modules() -> None:
    """Make the old module paths of :data:`MOVED` importable (idempotent)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
