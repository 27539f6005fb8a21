"""Every default value more than one entry point shares, named once: the env, the vector envs,
the rollouts command, Ray collection and the trainer adapters read them here.

Example:
    >>> MAX_STEPS, REQUEST_TIMEOUT_S, VERIFY_TIMEOUT_S
    (16, 60.0, 300.0)
"""

from __future__ import annotations

__all__ = [
    "CONCURRENCY",
    "MAX_STEPS",
    "RAY_WORKER_CONCURRENCY",
    "REQUEST_TIMEOUT_S",
    "ROLLOUT_REQUEST_TIMEOUT_S",
    "TRAINER_CONCURRENCY",
    "TRAINER_REQUEST_TIMEOUT_S",
    "VERIFY_TIMEOUT_S",
]

MAX_STEPS = 16
"""Model turns in an episode; past them the episode is verified as it stands and truncated."""

REQUEST_TIMEOUT_S = 60.0
"""One request of an env (or a resources-server client) to its server, ``/verify`` aside."""

VERIFY_TIMEOUT_S = 300.0
"""One ``POST /verify``: a verifier may run code or call a judge model."""

ROLLOUT_REQUEST_TIMEOUT_S = 120.0
"""Every request of a rollout collection (the rollouts command, ``collect``, ``ray_collect``),
``/verify`` included: many rollouts share one server, so one waits longer for its turn."""

TRAINER_REQUEST_TIMEOUT_S = 300.0
"""Every request of the NeMo RL producer: a slow server must not fail a training step."""

CONCURRENCY = 8
"""Rollouts in flight on one machine unless a setting or the policy says otherwise."""

RAY_WORKER_CONCURRENCY = 32
"""Rollouts in flight on each Ray worker (and rows re-verified at once by ``reverify``)."""

TRAINER_CONCURRENCY = 256
"""Rollouts in flight while the NeMo RL producer fills a training batch."""
