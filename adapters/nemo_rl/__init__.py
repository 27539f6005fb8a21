"""NeMo RL adapter: our environments as NeMo RL's ``task_to_env["nemo_gym"]``.

NeMo RL's GRPO drives NeMo Gym through a Ray actor (``nemo_rl.environments.nemo_gym.NemoGym``)
whose ``run_rollouts(rows, timer_prefix, ...)`` is an async generator of
``(row["_rowidx"], result, timing)``; GRPO reads ``result["message_log"]``,
``result["input_message_log"]`` and ``result["full_result"]["reward"]``. This package gives the
same contract over our Env/Episode and policies, one module per job:

- ``results``: :func:`to_nemo_rl_result`, one finished episode (its items carrying
  ``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``) -> NeMo RL's result
  dict, with every invariant NeMo RL asserts checked up front and reported by turn;
  :func:`check_nemo_rl_result`, :func:`token_turns`;
- ``producer``: :class:`NemoGymRollouts`, the rollout producer (``run_rollouts`` streams results
  as episodes finish), and its settings (the ``env.nemo_gym`` block);
- ``policy``: the default policy, NeMo RL's generation servers with every prompt pinned to the
  tokens seen so far;
- ``actor``: :func:`actor_class` (the producer as a ``@ray.remote`` actor, built on first use so
  importing this package never needs ray), :func:`spinup_actor`, and
  :func:`register_with_nemo_rl`, which makes NeMo RL's GRPO and distillation set-up create our
  actor instead of NeMo Gym's.

Example (no NeMo RL needed)::

    from nemo_gym_env.adapters.nemo_rl import to_nemo_rl_result
    env.reset(seed=0); ...                          # play with a policy returning token data
    result = to_nemo_rl_result(env.unwrapped.episode)
    [m["role"] for m in result["message_log"]]      # ['user', 'assistant', 'user', 'assistant']

The names below load on first use; the errors live in :mod:`nemo_gym_env.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.adapters.nemo_rl.actor import actor_class, register_with_nemo_rl, spinup_actor
    from nemo_gym_env.adapters.nemo_rl.producer import NemoGymRollouts
    from nemo_gym_env.adapters.nemo_rl.results import (
        TOKEN_FIELDS,
        TokenTurn,
        check_nemo_rl_result,
        to_nemo_rl_result,
        token_turns,
    )
    from nemo_gym_env.errors import NemoRLFormatError, RolloutFailed

__all__ = [
    "TOKEN_FIELDS",
    "NemoGymRollouts",
    "NemoRLFormatError",
    "RolloutFailed",
    "TokenTurn",
    "actor_class",
    "check_nemo_rl_result",
    "register_with_nemo_rl",
    "spinup_actor",
    "to_nemo_rl_result",
    "token_turns",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("NemoRLFormatError", "RolloutFailed"), "nemo_gym_env.errors"),
    **dict.fromkeys(("TOKEN_FIELDS", "TokenTurn", "check_nemo_rl_result", "to_nemo_rl_result", "token_turns"),
                    "nemo_gym_env.adapters.nemo_rl.results"),
    "NemoGymRollouts": "nemo_gym_env.adapters.nemo_rl.producer",
    **dict.fromkeys(("NemoGymActor", "actor_class", "register_with_nemo_rl", "spinup_actor"),
                    "nemo_gym_env.adapters.nemo_rl.actor"),
})
