"""Rollout collection: tasks through a policy against resources servers, one JSONL row per rollout.

The library behind ``nemo-gym-env rollouts``, usable from scripts::

    from nemo_gym_env.rollouts import RolloutSettings, RolloutWriter, plan_rollouts, run_plan, write_metrics

    settings = RolloutSettings(servers=["example_multi_step"], policy="scripted", num_repeats=4)
    plan = plan_rollouts(settings)
    with RolloutWriter(settings.output, resume=True) as writer:
        run_plan(plan, writer)
    print(write_metrics(settings.output)["agent_metrics"]["mean/reward"])

or, one server and rows in hand, :func:`collect` (an async iterator of rows).

- :mod:`~nemo_gym_env.rollouts.settings`: :class:`RolloutSettings`, every knob and its default;
- :mod:`~nemo_gym_env.rollouts.plan`: servers, tasks and policy, checked before anything starts;
- :mod:`~nemo_gym_env.rollouts.jobs`: what a run plays (:func:`expand`), one rollout (:func:`run_rollout`) and many
  (:func:`collect_jobs`), on one machine and on Ray;
- :mod:`~nemo_gym_env.rollouts.runner`: launch, run, write, stop cleanly on a signal;
- :mod:`~nemo_gym_env.rollouts.output`: the rollouts file, its failures sidecar, resuming;
- :mod:`~nemo_gym_env.rollouts.report`: metrics per server, the table, the progress line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.errors import RolloutFileError
    from nemo_gym_env.protocol.keys import FAILURE_CLASS_KEY
    from nemo_gym_env.rollouts.jobs import (
        RolloutJob,
        ServerClients,
        apply_sampling,
        collect,
        collect_jobs,
        expand,
        run_rollout,
    )
    from nemo_gym_env.rollouts.output import (
        RolloutWriter,
        failures_path,
        is_failure,
        metrics_path,
        read_rollouts,
    )
    from nemo_gym_env.rollouts.plan import RolloutPlan, Target, plan_rollouts, route_row
    from nemo_gym_env.rollouts.report import Progress, metrics_table, summarize, write_metrics
    from nemo_gym_env.rollouts.runner import run_plan
    from nemo_gym_env.rollouts.settings import RolloutSettings

__all__ = [
    "FAILURE_CLASS_KEY",
    "Progress",
    "RolloutFileError",
    "RolloutJob",
    "RolloutOptions",
    "RolloutPlan",
    "RolloutSettings",
    "RolloutWriter",
    "ServerClients",
    "Target",
    "apply_sampling",
    "collect",
    "collect_jobs",
    "expand",
    "failures_path",
    "is_failure",
    "metrics_path",
    "metrics_table",
    "plan_rollouts",
    "read_rollouts",
    "route_row",
    "run_plan",
    "run_rollout",
    "summarize",
    "write_metrics",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "RolloutFileError": "nemo_gym_env.errors",
    "FAILURE_CLASS_KEY": "nemo_gym_env.protocol.keys",
    **dict.fromkeys(("RolloutJob", "ServerClients", "apply_sampling", "collect", "collect_jobs", "expand", "run_rollout"),
                    "nemo_gym_env.rollouts.jobs"),
    **dict.fromkeys(("RolloutWriter", "failures_path", "is_failure", "metrics_path", "read_rollouts"),
                    "nemo_gym_env.rollouts.output"),
    **dict.fromkeys(("RolloutPlan", "Target", "plan_rollouts", "route_row"), "nemo_gym_env.rollouts.plan"),
    **dict.fromkeys(("Progress", "metrics_table", "summarize", "write_metrics"), "nemo_gym_env.rollouts.report"),
    "run_plan": "nemo_gym_env.rollouts.runner",
    **dict.fromkeys(("RolloutOptions", "RolloutSettings"), "nemo_gym_env.rollouts.settings"),
})
