"""What a launcher hands a server process through its environment (standard library only).

The launcher sets both variables when it spawns a server; the server process reads them
before it imports anything heavy, and removes them from its own environment before it starts
subprocesses of its own (tool sandboxes must not inherit the secret).
"""

from __future__ import annotations

__all__ = ["SERVER_ENV", "SESSION_SECRET_ENV"]

SERVER_ENV = "NEMO_GYM_ENV_SERVER"
"""Environment variable through which the launcher tells a child what to serve (JSON)."""

SESSION_SECRET_ENV = "NEMO_GYM_ENV_SESSION_SECRET"
"""Environment variable through which a launcher hands all workers of one server the same secret."""
