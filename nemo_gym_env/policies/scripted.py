"""Scripted policies: deterministic players for tests, benchmarks and the no-model demo.

They are not models: each bundled server ships a ``scripted.py`` that plays its tasks
correctly (or, with ``correct=False``, deliberately wrongly) from the row's ground truth.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn
from nemo_gym_env.protocol.scripting import play_turn
from nemo_gym_env.system.plugins import plugin_servers

__all__ = ["ScriptedPolicy", "scripted_player"]


def scripted_player(server: str) -> Callable[..., list[dict[str, Any]]]:
    """The bundled server's ``scripted_action(row, history, correct=...)`` function (a server plugin's:
    ``scripted.py`` in its package).

    A player with an ``observations`` parameter also gets the text of every user message so far
    (a hosted env's observations), the latest last.
    """
    plugin = plugin_servers().get(server)
    package = plugin.module if plugin is not None else f"nemo_gym_env.servers.{server}"
    try:
        module = importlib.import_module(f"{package}.scripted")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.scripted" and not f"{package}.scripted".startswith(f"{exc.name}."):
            raise  # the player itself imports something missing: say that, not that it has none
        raise KeyError(f"server {server!r} has no scripted player ({package}.scripted)") from exc
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
        """The scripted next turn; reads only the row and what the episode showed so far."""
        return PolicyTurn(items=play_turn(self._play, request.row, request.input, request.history,
                                          correct=self.correct))
