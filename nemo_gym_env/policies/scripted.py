"""Scripted policies: deterministic players for tests, benchmarks and the no-model demo.

They are not models: each bundled server ships a ``scripted.py`` that plays its tasks
correctly (or, with ``correct=False``, deliberately wrongly) from the row's ground truth.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn

__all__ = ["ScriptedPolicy", "scripted_player"]


def scripted_player(server: str) -> Callable[..., list[dict[str, Any]]]:
    """The bundled server's ``scripted_action(row, history, correct=...)`` function."""
    try:
        module = importlib.import_module(f"nemo_gym_env.servers.{server}.scripted")
    except ModuleNotFoundError as exc:
        raise KeyError(f"bundled server {server!r} has no scripted player (servers/{server}/scripted.py)") from exc
    return module.scripted_action


class ScriptedPolicy(Policy):
    """A bundled server's scripted player behind the :class:`Policy` interface.

    Example:
        >>> policy = ScriptedPolicy("example_single_tool_call")
        >>> policy.name
        'scripted:example_single_tool_call'
    """

    def __init__(self, server: str, *, correct: bool = True):
        self.server = server
        self.correct = correct
        self._play = scripted_player(server)
        self.name = f"scripted:{server}" + ("" if correct else ":wrong")

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        """The scripted next turn; reads only the row and the tool outputs seen so far."""
        outputs = [item for item in request.history if item.get("type") == "function_call_output"]
        return PolicyTurn(items=self._play(request.row, outputs, correct=self.correct))
