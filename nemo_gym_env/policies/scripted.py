"""Scripted policies: deterministic players for tests, benchmarks and the no-model demo.

They are not models: each bundled server ships a ``scripted.py`` that plays its tasks
correctly (or, with ``correct=False``, deliberately wrongly) from the row's ground truth.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn
from nemo_gym_env.protocol.items import content_text

__all__ = ["ScriptedPolicy", "scripted_player"]


def scripted_player(server: str) -> Callable[..., list[dict[str, Any]]]:
    """The bundled server's ``scripted_action(row, history, correct=...)`` function.

    A player with an ``observations`` parameter also gets the text of every user message so far
    (a hosted env's observations), the latest last.
    """
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
        # A player that reads the env's observations (the bridge's hosted envs) says so in its signature.
        self._reads_observations = "observations" in inspect.signature(self._play).parameters
        self.name = f"scripted:{server}" + ("" if correct else ":wrong")

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        """The scripted next turn; reads only the row and the tool outputs seen so far."""
        outputs = [item for item in request.history if item.get("type") == "function_call_output"]
        if not self._reads_observations:
            return PolicyTurn(items=self._play(request.row, outputs, correct=self.correct))
        said = [content_text(item.get("content")) for item in [*request.input, *request.history]
                if item.get("type", "message") == "message" and item.get("role") == "user"]
        return PolicyTurn(items=self._play(request.row, outputs, correct=self.correct, observations=said))
