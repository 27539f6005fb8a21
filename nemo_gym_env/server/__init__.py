"""The server side: everything a resources server's ``app.py`` imports.

A NeMo Gym server ports by renaming the modules it imports from: both
``nemo_gym.base_resources_server`` and ``nemo_gym.server_utils`` become ``nemo_gym_env.server``,
which exports every name they did (see ``docs/porting.md``)::

    from nemo_gym_env.server import (
        BaseResourcesServerConfig, BaseVerifyRequest, BaseVerifyResponse, SimpleResourcesServer,
    )

- :mod:`~nemo_gym_env.server.base`: :class:`SimpleResourcesServer` and its config;
- :mod:`~nemo_gym_env.server.middleware`: the hardening every server gets (guarded verify,
  error replies, session ids, body limits);
- :mod:`~nemo_gym_env.server.sessions`: the bounded per-session state store;
- :mod:`~nemo_gym_env.server.serving`: the server process's side of the launcher;
- :mod:`~nemo_gym_env.server.workers`: process-pool and Ray runners for CPU-heavy verification;
- :mod:`~nemo_gym_env.server.testing`, :mod:`~nemo_gym_env.server.scaffold`: test helpers
  and ``nemo-gym-env init`` (a scripted player builds its items with
  :mod:`nemo_gym_env.protocol.scripting`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.errors import SessionLostError
    from nemo_gym_env.protocol.keys import STEP_REWARD_HEADER
    from nemo_gym_env.protocol.types import (
        RESERVED_ROUTES,
        AggregateMetrics,
        AggregateMetricsRequest,
        BaseRunRequest,
        BaseSeedSessionRequest,
        BaseSeedSessionResponse,
        BaseVerifyRequest,
        BaseVerifyResponse,
    )
    from nemo_gym_env.server.base import BaseResourcesServerConfig, SimpleResourcesServer, set_step_reward
    from nemo_gym_env.server.middleware import SESSION_ID_KEY
    from nemo_gym_env.server.sessions import SessionStore
    from nemo_gym_env.system.child_env import SESSION_SECRET_ENV

__all__ = [
    "RESERVED_ROUTES",
    "SESSION_ID_KEY",
    "SESSION_SECRET_ENV",
    "STEP_REWARD_HEADER",
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseResourcesServerConfig",
    "BaseRunRequest",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
    "SessionLostError",
    "SessionStore",
    "SimpleResourcesServer",
    "set_step_reward",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "SessionLostError": "nemo_gym_env.errors",
    "SESSION_SECRET_ENV": "nemo_gym_env.system.child_env",
    **dict.fromkeys(("RESERVED_ROUTES", "AggregateMetrics", "AggregateMetricsRequest", "BaseRunRequest",
                     "BaseSeedSessionRequest", "BaseSeedSessionResponse", "BaseVerifyRequest", "BaseVerifyResponse"),
                    "nemo_gym_env.protocol.types"),
    **dict.fromkeys(("BaseResourcesServerConfig", "SimpleResourcesServer", "set_step_reward"),
                    "nemo_gym_env.server.base"),
    "STEP_REWARD_HEADER": "nemo_gym_env.protocol.keys",
    "SESSION_ID_KEY": "nemo_gym_env.server.middleware",
    "SessionStore": "nemo_gym_env.server.sessions",
})
