"""Shared pieces of the reliability suite: fixture servers, figures, process helpers.

Every test that measures something records it with the ``figures`` fixture; the figures are
printed at the end of the run and, with ``NEMO_GYM_ENV_FIGURES=path.json``, written there
(docs/reliability.md is written from such a file). They travel in the test's report
(``user_properties``), so that the run's summary has them under pytest-xdist too
(``tests/conftest.py`` prints and writes them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_env.launch.config import ServerSpec

from ..conftest import FIGURE
from ..fixtures import fixture_specs

SOAK_ENV = "NEMO_GYM_ENV_SOAK"


class Figures:
    """Records ``(test, name) -> value`` figures of one test, in its report."""

    def __init__(self, node: pytest.Item):
        self.node = node
        chain = node.listchain()  # not the node id: xdist's --dist loadgroup appends "@<group>" to it
        self.test = "::".join(n.name for n in chain[chain.index(node.getparent(pytest.Module)) + 1:])

    def record(self, name: str, value: Any, unit: str = "") -> Any:
        self.node.user_properties.append((FIGURE, {"test": self.test, "name": name, "value": value, "unit": unit}))
        return value


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.node)


# ---- fixture servers ------------------------------------------------------------------------------


def with_config(spec: ServerSpec, **config: Any) -> ServerSpec:
    """``spec`` with extra config keys."""
    import dataclasses

    return dataclasses.replace(spec, config={**spec.config, **config})


def tool(name: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "function", "name": name, "description": name, "strict": False,
            "parameters": {"type": "object", "properties": properties or {}, "required": []}}


FAULTY_TOOLS = [tool("effect", {"nonce": {"type": "string"}}), tool("ok"), tool("hang"),
                tool("slow", {"seconds": {"type": "number"}})]


def faulty_row(**extra: Any) -> dict[str, Any]:
    """A task row for the faulty fixture server."""
    return {"responses_create_params": {"input": "exercise the server", "tools": FAULTY_TOOLS}, **extra}


def call(name: str, arguments: dict[str, Any] | None = None, call_id: str = "c0") -> dict[str, Any]:
    """A ``function_call`` item."""
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": json.dumps(arguments or {})}


def answer(text: str = "done") -> dict[str, Any]:
    """A final assistant message (ends the episode)."""
    return {"type": "message", "role": "assistant", "content": text}


# ---- processes and numbers -------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def soak() -> bool:
    """Whether the long soak variants run (``NEMO_GYM_ENV_SOAK=1``, by hand)."""
    return os.environ.get(SOAK_ENV) == "1"


@pytest.fixture(scope="module")
def faulty_server() -> Iterator[Any]:
    """One faulty fixture server for a test module (not restarted)."""
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher(ready_timeout_s=60) as launcher:
        yield launcher.start(fixture_specs("reliability")["rel_faulty"])


def counts(url: str) -> dict[str, Any]:
    import httpx

    return httpx.get(f"{url}/_counts", timeout=10, trust_env=False).json()


def arm(url: str, route: str | None = None, modes: list[str] | None = None, reset: bool = False) -> None:
    import httpx

    order = {"route": route, "modes": modes or [], "reset": reset}
    assert httpx.post(f"{url}/_arm", json=order, timeout=10, trust_env=False).status_code == 200
