"""How a package's public names are reached: lazily, on first use. Standard library only.

A package's ``__init__`` lists which submodule defines each public name, and the name is
imported on first access (a server process imports this before anything else). Importing
``nemo_gym_env.protocol.keys`` then does not import the wire types (pydantic), and
``nemo_gym_env.NemoGymEnv`` does not import the env stack until it is used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


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

