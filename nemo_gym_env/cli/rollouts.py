"""``nemo-gym-env rollouts``: arguments -> :class:`~nemo_gym_env.rollouts.settings.RolloutSettings` -> the library."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from nemo_gym_env.cli.common import PROG, env_yaml_path, say, split_targets
from nemo_gym_env.launch.config import config_value
from nemo_gym_env.rollouts.output import failures_path, metrics_path
from nemo_gym_env.rollouts.plan import plan_rollouts
from nemo_gym_env.rollouts.report import metrics_table, write_metrics
from nemo_gym_env.rollouts.runner import open_output, run_plan
from nemo_gym_env.rollouts.settings import RolloutSettings
from nemo_gym_env.system.processes import sigterm_raises

__all__ = ["cmd_rollouts", "settings_of"]


def settings_of(args: argparse.Namespace) -> RolloutSettings:
    """The run's settings from the parsed arguments (their checks raise ``UsageError``)."""
    names, overrides = split_targets(args.targets)
    return RolloutSettings(
        servers=list(dict.fromkeys([*names, *(args.server or [])])), overrides=overrides,
        head_url=args.head_url, server_url=args.server_url, input=args.input, output=args.output,
        limit=args.limit, strict=args.strict, log_dir=args.log_dir, env_yaml=env_yaml_path(args),
        stream_logs=args.debug, policy=args.policy, model=args.model, base_url=args.base_url,
        api_key=args.api_key, api=args.api, device=args.device, dtype=args.dtype, seed=args.seed, temperature=args.temperature,
        top_p=args.top_p, max_output_tokens=args.max_output_tokens, num_repeats=args.num_repeats,
        concurrency=args.concurrency, max_steps=args.max_steps,
        max_episode_tokens=args.max_episode_tokens, timeout=args.timeout,
        attempt_timeout=args.attempt_timeout, turn_timeout=args.turn_timeout, resume=args.resume, allow_changes=args.allow_changes,
        first_reply_timeout=args.first_reply_timeout,
        episode_reward=args.episode_reward,
    )


def cmd_rollouts(args: argparse.Namespace) -> int:
    """Collect rollouts: tasks x repeats through a policy against resources servers."""
    settings = settings_of(args)
    plan = plan_rollouts(settings, say=say, background=True)  # the model loads while the servers start
    output = Path(settings.output)
    secrets = [s for s in (settings.api_key, config_value(plan.cfg, "policy_api_key")) if s]
    if not settings.resume and output.is_file() and output.stat().st_size:
        say(f"starting {output} over (it had rows; --resume continues a run instead)")
    with sigterm_raises(), open_output(plan, secrets=secrets, say=say) as writer:
        if writer.torn_bytes:
            say(f"dropped a torn last line ({writer.torn_bytes} bytes) of {output} left by an interrupted run")
        if settings.resume:
            say(f"resuming {output}: {writer.resumed_rows} row(s) already there")
        stopped = run_plan(plan, writer, say=say)
    if stopped:
        say(f"interrupted: {output} holds every finished rollout; rerun with --resume to finish")
        return 128 + int(stopped[0])
    summary = write_metrics(output)
    print(metrics_table(summary))
    print(f"\nrollouts: {output} ({summary['num_rollouts']} rows)\nmetrics:  {metrics_path(output)}")
    if summary["num_failed"]:
        print(f"failures: {failures_path(output)}")
    print(f"view:     {PROG} view {shlex.quote(str(output))}")
    if summary["num_failed"]:
        say(f"{summary['num_failed']} rollout(s) failed (reasons in {failures_path(output)}); --resume retries them")
        return 1
    return 0
