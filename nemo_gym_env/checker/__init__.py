"""``nemo-gym-env check``: is a resources server right? Gymnasium's ``check_env``, for servers.

- :mod:`~nemo_gym_env.checker.suite`: :func:`check_server`, the checks and their rules;
- :mod:`~nemo_gym_env.checker.probes`: bounded requests (every one has a timeout, none raises);
- :mod:`~nemo_gym_env.checker.schemas`: tools as OpenAI function definitions;
- :mod:`~nemo_gym_env.checker.report`: the verdicts, as a table or JSON.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.checker.report import Check, Report
    from nemo_gym_env.checker.suite import CheckSettings, check_server

__all__ = ["Check", "CheckSettings", "Report", "check_server"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "Check": "nemo_gym_env.checker.report",
    "Report": "nemo_gym_env.checker.report",
    "CheckSettings": "nemo_gym_env.checker.suite",
    "check_server": "nemo_gym_env.checker.suite",
})
