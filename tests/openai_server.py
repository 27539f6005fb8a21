"""Old import path of :mod:`tests.fixtures.openai_server`; ``tests/adapters`` imports ``running_server`` from here."""

from __future__ import annotations

from tests.fixtures.openai_server import running_server

__all__ = ["running_server"]
