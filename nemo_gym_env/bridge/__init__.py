"""Other libraries' environments served as resources servers: any ``gymnasium.Env``, TextArena's games.

- :mod:`~nemo_gym_env.bridge.gymnasium_env`: :class:`GymnasiumEnvServer`, a ``gymnasium.Env`` behind
  ``/reset`` and ``/step`` (text observations, actions read from the model's turn);
- :mod:`~nemo_gym_env.bridge.textarena_game`: :class:`TextArenaServer`, a TextArena game, with an
  opponent of ours (:mod:`~nemo_gym_env.bridge.opponents`) for two-player games;
- :mod:`~nemo_gym_env.bridge.hosted`: what both share (one env per session, seeds, failures);
- :mod:`~nemo_gym_env.bridge.actions`: the answer format and its parser;
- :mod:`~nemo_gym_env.bridge.toy_text`: Gymnasium's toy-text envs in words;
- :mod:`~nemo_gym_env.bridge.targets`: ``gymnasium:ENV_ID`` / ``textarena:GAME`` as server configs;
- :mod:`~nemo_gym_env.bridge.datasets`: task rows, one per seed, train and held-out;
- :mod:`~nemo_gym_env.bridge.loading`: ids, ``module:Class`` and ``module:function`` found or refused in one line.

``docs/bring_your_env.md`` walks through each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.bridge.actions import ActionFormat
    from nemo_gym_env.bridge.datasets import make_dataset
    from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer
    from nemo_gym_env.bridge.targets import target_config
    from nemo_gym_env.bridge.textarena_game import TextArenaServer

__all__ = ["ActionFormat", "GymnasiumEnvServer", "TextArenaServer", "make_dataset", "target_config"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "ActionFormat": "nemo_gym_env.bridge.actions",
    "GymnasiumEnvServer": "nemo_gym_env.bridge.gymnasium_env",
    "TextArenaServer": "nemo_gym_env.bridge.textarena_game",
    "make_dataset": "nemo_gym_env.bridge.datasets",
    "target_config": "nemo_gym_env.bridge.targets",
})
