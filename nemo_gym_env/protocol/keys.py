"""The bookkeeping keys NeMo Gym adds to rows, in one place.

A rollout row is the ``/verify`` reply plus :data:`TASK_INDEX_KEY` and :data:`ROLLOUT_INDEX_KEY`
(and, in ours, :data:`TASK_KEY_KEY`);
a row routed to one of several servers names it in :data:`AGENT_REF_KEY`; a failed rollout
(written to the failures sidecar, never to the rollouts file) carries :data:`FAILURE_CLASS_KEY`.
"""

from __future__ import annotations

__all__ = ["AGENT_REF_KEY", "FAILURE_CLASS_KEY", "ROLLOUT_INDEX_KEY", "STEP_REWARDS_KEY", "STEP_REWARD_HEADER",
           "SERVER_TYPES", "STEP_REWARD_SUM_KEY", "TASK_INDEX_KEY", "TASK_KEY_KEY", "TOKEN_FIELDS", "VERIFY_REWARD_KEY"]

TASK_INDEX_KEY = "_ng_task_index"
"""The task's index in its dataset."""

TASK_KEY_KEY = "_ng_task_key"
"""The task's identity: a digest of its row's content (see :mod:`nemo_gym_env.rollouts.identity`).
Unlike the index, it does not change when the input is reordered or another server joins the run."""

ROLLOUT_INDEX_KEY = "_ng_rollout_index"
"""Which repeat of the task this rollout is (0 .. num_repeats - 1)."""

AGENT_REF_KEY = "agent_ref"
"""``{"type": ..., "name": ...}``: the agent (or resources server) a row plays on."""

FAILURE_CLASS_KEY = "_ng_failure_class"
"""Marks a failed rollout (NeMo Gym's sidecar key); its value says whose fault:
``server_error``, ``policy_error`` or ``policy_timeout``. A ``server_error`` whose ``/verify``
reply judged nothing (:mod:`nemo_gym_env.protocol.failures`) also carries that reply's
``failure_kind`` and the episode (``response``); one whose server could not be reached when the
episode began carries ``failure_kind: server_unreachable`` (nothing was played)."""

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
"""The per-call training fields on the last output item of each model call (docs/architecture.md,
"The wire"): everything the model saw, what it generated, and each generated token's log-probability."""

STEP_REWARD_HEADER = "x-nemo-gym-step-reward"
"""The response header by which a tool route gives a step reward (a finite number as text).

A header, not a field of the body: the body is the tool output the model reads, unchanged, and
NeMo Gym's own agent passes that body to the model and reads no header but ``Set-Cookie``, so a
NeMo Gym server that sets it still runs unchanged under NeMo Gym (``docs/rollouts.md``)."""

STEP_REWARDS_KEY = "step_rewards"
"""A rollout row's per-turn step rewards (one number per model turn), when the server gave any."""

STEP_REWARD_SUM_KEY = "step_reward_sum"
"""The sum of a rollout row's :data:`STEP_REWARDS_KEY`."""

VERIFY_REWARD_KEY = "verify_reward"
"""The ``/verify`` reward of a row whose ``reward`` was made the sum of it and the step rewards
(``episode_reward="sum"``)."""

SERVER_TYPES: tuple[str, ...] = ("resources_servers", "responses_api_agents", "responses_api_models")
"""The server-type keys of a NeMo Gym config, directly under an instance name."""
