"""``git_history``: questions about a generated Git history, answered through an MCP server's tools.

Each task row names a history (``history_seed``, ``num_commits``; see
:mod:`~nemo_gym_env.servers.git_history.history`). On ``/seed_session`` the server writes that
history as a real repository in the session's own folder and starts its own ``mcp-server-git``
(the Git MCP server from PyPI) on it; the model reads the history with the server's tools,
which this resources server serves as routes (:class:`~nemo_gym_env.server.mcp_bridge.McpResourcesServer`):

    ``POST /git_log`` ``{"repo_path": ".", "max_count": int}``: the commits, newest first
    (hash, author, date, message); ``POST /git_show`` ``{"repo_path": ".", "revision": str}``:
    one commit and its diff; also ``git_status``, ``git_branch`` and ``git_diff``. The tools that
    change a repository (``git_commit``, ``git_add``, ...) are left out (``tools:`` in the config).
    ``repo_path`` is relative to the session's folder, and the MCP server refuses any path outside it.

Questions (``kind``): ``author`` (who wrote the commit with this message), ``file`` (which file
did it change), ``count`` (how many commits), ``first`` (the first commit's message).

Reward: 1.0 when the final answer (the last ``\\boxed{...}`` of the last assistant message, or
the whole message when it has none) equals the row's ``expected_answer``, case, spacing, quotes
and a final period aside; else 0.0. Metrics: ``answer``, ``correct_answer``, ``num_tool_calls``.

Run standalone (the launcher passes the config): ``python app.py``; needs the ``mcp`` extra.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from typing import Any

from nemo_gym_env.protocol.items import final_answer
from nemo_gym_env.servers.git_history.history import MAX_COMMITS, MIN_COMMITS, make_history, write_repo

try:
    from nemo_gym_env.server.mcp_bridge import McpResourcesServer, McpResourcesServerConfig
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    raise RuntimeError(f"git_history needs the MCP SDK ({exc}): pip install 'nemo-gym-env[mcp]'") from exc

__all__ = ["GitHistoryServer", "normalize", "read_answer"]

_BOXED = re.compile(r"\\boxed\{([^{}]{0,300})\}")
_SPACES = re.compile(r"\s+")


def read_answer(text: str) -> str:
    """The content of the last ``\\boxed{...}`` in ``text``, or ``text`` itself when it has none.

    Example:
        >>> read_answer("Two commits: \\\\boxed{3}"), read_answer("Ada Moreau")
        ('3', 'Ada Moreau')
    """
    found = _BOXED.findall(text[-100_000:])
    return found[-1] if found else text


def normalize(text: str) -> str:
    """Case, spacing, surrounding quotes and a final period folded: ``' "Ada  MOREAU." '`` -> ``'ada moreau'``."""
    return _SPACES.sub(" ", text).strip().strip("\"'`").strip().rstrip(".").strip().casefold()


class GitHistoryServer(McpResourcesServer):
    """The ``git_history`` resources server; see the module docstring."""

    REVERIFY_MODE = "stateless"  # /verify reads only its body
    config: McpResourcesServerConfig

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if importlib.util.find_spec("mcp_server_git") is None:
            raise RuntimeError("git_history needs mcp-server-git: pip install 'nemo-gym-env[mcp]'")
        if shutil.which("git") is None:  # it writes each session's repository with git
            raise RuntimeError("git_history needs the git program on PATH (Debian/Ubuntu: apt-get install git)")

    def prepare_session(self, row: dict[str, Any] | None, session_dir: Path) -> None:
        """Write the row's history as a repository in ``session_dir`` (history 0 for the start-up probe).

        Raises:
            ValueError: the row names no valid history (answered 422).
        """
        seed, count = (0, MIN_COMMITS) if row is None else (row.get("history_seed"), row.get("num_commits"))
        if isinstance(seed, bool) or not isinstance(seed, int) or isinstance(count, bool) or not isinstance(count, int):
            raise ValueError("a git_history row needs integer 'history_seed' and 'num_commits' "
                             f"({MIN_COMMITS} to {MAX_COMMITS})")
        write_repo(session_dir, make_history(seed, count))

    async def score(self, row: dict[str, Any], trajectory: list[dict[str, Any]], session_id: str) -> dict[str, Any]:
        """1.0 for the expected answer, else 0.0 (see the module docstring)."""
        answer = read_answer(final_answer(trajectory))
        correct = bool(answer.strip()) and normalize(answer) == normalize(str(row.get("expected_answer", "")))
        calls = sum(1 for item in trajectory if item.get("type") == "function_call")
        return {"reward": 1.0 if correct else 0.0, "answer": answer[:300], "correct_answer": correct,
                "num_tool_calls": calls}


if __name__ == "__main__":
    GitHistoryServer.run_webserver()
