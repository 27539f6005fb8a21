"""Look at what the agent did: a rollout viewer and a page to play an environment by hand.

Local web apps with no other service and no network: a JSON API (FastAPI) and a static page
shipped in this package (``static/``: HTML, JS and CSS, no CDN). ``nemo-gym-env view`` and
``nemo-gym-env play`` call :func:`run_view` and :func:`run_play`::

    from nemo_gym_env.viewer import run_view
    run_view(["results/rollouts.jsonl"], port=8080)     # serves until Ctrl-C

The parts: ``index`` (byte-offset index of a JSONL file, followed as it grows), ``rows``
(list columns of a row, and the scrubbing of everything served), ``library`` (the files of a
viewer and the queries on them), ``summary``, ``view_app`` and ``play_app`` (the two apps),
``web`` (what they share), ``run`` (serving them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_gym_env.viewer.play_app import EnvSpec
    from nemo_gym_env.viewer.run import run_play, run_view

__all__ = ["EnvSpec", "run_play", "run_view"]

_LAZY = {"EnvSpec": ".play_app", "run_play": ".run", "run_view": ".run"}


def __getattr__(name: str) -> Any:
    # Lazy: the index and the rows helpers are usable without importing the web stack.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
