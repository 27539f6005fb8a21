"""The env side: a resources server behind the Gymnasium API.

- :mod:`~nemo_gym_env.envs.env`: :class:`NemoGymEnv`, one episode at a time;
- :mod:`~nemo_gym_env.envs.vector`: :class:`NemoGymVectorEnv`, thousands on one event loop;
- :mod:`~nemo_gym_env.envs.mixture`, :mod:`~nemo_gym_env.envs.mixture_vector`: several envs by
  weight (``NemoGym/Mixture-v0``, :class:`NemoGymMixtureVectorEnv`, :func:`mixture_rows`);
- :mod:`~nemo_gym_env.envs.episode`: :class:`Episode`, the state and steps both share;
- :mod:`~nemo_gym_env.envs.actions`: what a model turn may be, normalised into items;
- :mod:`~nemo_gym_env.envs.spaces`: the observation and action spaces;
- :mod:`~nemo_gym_env.envs.sources`, :mod:`~nemo_gym_env.envs.tasks`: where servers are (:class:`ServerSet`,
  the one every entry point takes its servers from), which task a reset picks;
- :mod:`~nemo_gym_env.envs.make`, :mod:`~nemo_gym_env.envs.registration`: ``gym.make`` and the
  ``NemoGym/*`` ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.envs.actions import normalize_action
    from nemo_gym_env.envs.env import NemoGymEnv
    from nemo_gym_env.envs.episode import Episode
    from nemo_gym_env.envs.mixture import mixture_rows
    from nemo_gym_env.envs.mixture_vector import NemoGymMixtureVectorEnv
    from nemo_gym_env.envs.registration import GENERIC_ID, MIXTURE_ID, env_id, register_envs
    from nemo_gym_env.envs.sources import ServerSet
    from nemo_gym_env.envs.spaces import JsonItems, ResponsesAction
    from nemo_gym_env.envs.vector import NemoGymVectorEnv

__all__ = [
    "GENERIC_ID",
    "MIXTURE_ID",
    "Episode",
    "JsonItems",
    "NemoGymEnv",
    "NemoGymMixtureVectorEnv",
    "NemoGymVectorEnv",
    "ResponsesAction",
    "ServerSet",
    "env_id",
    "mixture_rows",
    "normalize_action",
    "register_envs",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "normalize_action": "nemo_gym_env.envs.actions",
    "NemoGymEnv": "nemo_gym_env.envs.env",
    "Episode": "nemo_gym_env.envs.episode",
    **dict.fromkeys(("GENERIC_ID", "MIXTURE_ID", "env_id", "register_envs"), "nemo_gym_env.envs.registration"),
    "mixture_rows": "nemo_gym_env.envs.mixture",
    "NemoGymMixtureVectorEnv": "nemo_gym_env.envs.mixture_vector",
    **dict.fromkeys(("JsonItems", "ResponsesAction"), "nemo_gym_env.envs.spaces"),
    "NemoGymVectorEnv": "nemo_gym_env.envs.vector",
    "ServerSet": "nemo_gym_env.envs.sources",
})
