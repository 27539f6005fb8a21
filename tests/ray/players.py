"""Old import path of :mod:`tests.ray_cluster.players`; ``tests/adapters`` imports ``TokenPolicy`` from here."""

from __future__ import annotations

from tests.ray_cluster.players import TokenPolicy, TokenPolicyFactory

__all__ = ["TokenPolicy", "TokenPolicyFactory"]
