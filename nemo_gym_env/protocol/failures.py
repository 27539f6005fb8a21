"""Whose fault: the one line between a reward that judges the model and a failure that is no reward.

A ``/verify`` reply with ``reward: 0.0`` means two different things. With ``failure_kind:
wrong_answer`` the model was judged and lost: that 0 is a training signal. With ``failure_kind:
verify_timeout`` nobody judged anything (the checker ran out of time, a worker was lost, the
verifier raised): a 0 there teaches the model something false. Everything in this package that
turns a verify reply into a reward (the env and the vector env, rollout collection on one machine
and on Ray, the CLI, the TRL and NeMo RL adapters) asks :func:`verdict_failure` which one it holds,
so the line is drawn here and nowhere else:

- **the model's fault** (the reward stands): every ``failure_kind`` not listed below, such as
  ``wrong_answer``, ``syntax_error``, ``runtime_error``, ``timeout`` and ``memory`` (the model's
  program), ``no_code``, ``no_answer``, ``answer_too_long``, ``response_too_long``; and a reply
  without a ``failure_kind``;
- **infrastructure** (:data:`INFRASTRUCTURE_KINDS`: no reward; retrying can succeed): the
  verifier's time ran out, its worker or task was lost, it raised or returned no finite reward;
  and any reply with ``mask_sample: true`` (NeMo Gym 0.7's own mark of such a failure);
- **the task row** (:data:`TASK_KINDS`: no reward; the row must be fixed): the verifier cannot
  rebuild or read the task it was given.

Failures on the client's side (the server did not answer, the policy failed or timed out) never
have a reward to begin with; they are failure rows (:data:`~nemo_gym_env.protocol.keys.FAILURE_CLASS_KEY`).
A failure is written to the failures sidecar, never as a row with reward 0, so ``--resume`` retries
it; a trainer that needs every slot filled gets the slot masked (``mask_sample: true``), never scored.

Example:
    >>> verdict_failure({"reward": 0.0, "failure_kind": "wrong_answer"}) is None
    True
    >>> verdict_failure({"reward": 0.0, "failure_kind": "verify_timeout", "failure_reason": "slow"})
    ('verify_timeout', 'verify_timeout (infrastructure; no reward): slow')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["INFRASTRUCTURE_KINDS", "TASK_KINDS", "is_reward", "verdict_failure"]

INFRASTRUCTURE_KINDS = frozenset({
    "verify_timeout",   # math: math-verify (a pool worker or a Ray task) did not finish in time
    "score_timeout",    # reasoning_gym: rebuilding and scoring the task took too long
    "scorer_error",     # reasoning_gym: the library's scorer raised or its worker crashed
    "sandbox_lost",     # code_gen: the Ray task running a test never came back
    "verifier_error",   # any server on our kit: the verifier raised
    "invalid_reward",   # any server on our kit: the verifier returned a reward that is not a finite number
})
"""``failure_kind`` values that say the verifier could not judge, through no fault of the model."""

TASK_KINDS = frozenset({
    "unknown_task",         # reasoning_gym: no such task in the installed library
    "invalid_task_config",  # reasoning_gym: the task cannot be built with the row's config
    "task_mismatch",        # reasoning_gym: the row's question is not the one the library makes
    "invalid_instruction",  # instruction_following: an instruction id or kwargs the verifier cannot check
})
"""``failure_kind`` values that say the task row cannot be judged as written."""


def verdict_failure(reply: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(kind, reason)`` when a ``/verify`` reply is no judgement of the model; None when its reward stands.

    ``kind`` is the reply's ``failure_kind`` (``"masked"`` for a bare ``mask_sample: true``);
    ``reason`` says whose fault it is and quotes the reply's ``failure_reason``.
    """
    kind = reply.get("failure_kind")
    kind = kind if isinstance(kind, str) and kind else None
    masked = reply.get("mask_sample") is True
    if not masked and kind not in INFRASTRUCTURE_KINDS and kind not in TASK_KINDS:
        return None
    kind = kind or "masked"
    reason = reply.get("failure_reason")
    if not isinstance(reason, str) or not reason:
        reason = "the verifier marked the sample masked (mask_sample: true)" if masked and kind == "masked" else \
            f"the verifier could not judge the episode ({kind})"
    whose = "the task row" if kind in TASK_KINDS else "infrastructure"
    return kind, f"{kind} ({whose}; no reward): {reason}"


def is_reward(reply: Mapping[str, Any]) -> bool:
    """Whether a ``/verify`` reply's ``reward`` judges the model (see the module docstring)."""
    return verdict_failure(reply) is None
