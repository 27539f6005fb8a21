"""Picklable test policies: scripted players that also return well-formed token data.

They travel to Ray workers by reference (``tests.ray_cluster.players``), so the test cluster puts the
repository root on its workers' ``PYTHONPATH``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from nemo_gym_env.policies import Policy, PolicyRequest, PolicyTurn, ScriptedPolicy


def _tokens(value: Any) -> list[int]:
    """A made-up tokenizer: the UTF-8 bytes of the JSON text (ids 0..255)."""
    return list(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())


class TokenPolicy(Policy):
    """A bundled server's scripted player whose turns carry token data with the continuation invariant.

    Turn k's prompt is turn k-1's prompt + generation + the tokens of the environment items
    since then (the task input on the first turn); the generation is the tokens of the turn's
    items (at most 24) with log-probs in (-1, 0).

    Args:
        server: The bundled server whose scripted player to use.
        delay_s: Sleep this long per turn (a model's latency).
        spin_ms: Burn this much CPU per turn (a small model's compute, for benchmarks).
        pid_dir: Write ``<pid>`` files here (tests find and kill the worker processes).
    """

    def __init__(self, server: str, *, delay_s: float = 0.0, spin_ms: float = 0.0, pid_dir: str | None = None):
        self.scripted = ScriptedPolicy(server)
        self.delay_s = delay_s
        self.spin_ms = spin_ms
        self.name = f"tokens:{server}"
        if pid_dir is not None:
            Path(pid_dir, str(os.getpid())).write_text(str(os.getpid()))

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.spin_ms:
            until = time.process_time() + self.spin_ms / 1000
            while time.process_time() < until:
                pass
        items = (await self.scripted.generate(request)).items
        last = max((n for n, item in enumerate(request.history) if "generation_token_ids" in item), default=None)
        if last is None:
            seen, new = [], _tokens(request.input)
        else:
            item = request.history[last]
            seen = list(item["prompt_token_ids"]) + list(item["generation_token_ids"])
            new = _tokens(request.history[last + 1:])
        generation = _tokens(items)[:24]
        log_probs = [-((i % 9) + 1) / 10 for i in range(len(generation))]
        return PolicyTurn(items=items, prompt_token_ids=seen + new, generation_token_ids=generation,
                          generation_log_probs=log_probs)


class TokenPolicyFactory:
    """A picklable factory of :class:`TokenPolicy` (what ``ray_collect`` builds on each worker)."""

    def __init__(self, server: str, **kwargs: Any):
        self.server = server
        self.kwargs = kwargs

    def __call__(self) -> TokenPolicy:
        return TokenPolicy(self.server, **self.kwargs)


class MathAnswers(Policy):
    """``math``'s scripted player, right on some tasks and wrong on the others (by the expected answer's
    text, so every run, local or on Ray, gives each task the same answer). Pass the class as the factory."""

    def __init__(self) -> None:
        self.name = "scripted:math:mixed"
        self._right = ScriptedPolicy("math")
        self._wrong = ScriptedPolicy("math", correct=False)

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        right = sum(map(ord, str(request.row.get("expected_answer")))) % 2 == 0
        return await (self._right if right else self._wrong).generate(request)
