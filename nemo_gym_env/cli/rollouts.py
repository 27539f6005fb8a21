"""``nemo-gym-env rollouts``: arguments -> :class:`~nemo_gym_env.rollouts.settings.RolloutSettings` -> the library."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path

from nemo_gym_env.cli.common import PROG, add_env_yaml, describe, env_yaml_path, say, split_targets
from nemo_gym_env.policies.factory import LOCAL_DTYPES, POLICY_KINDS
from nemo_gym_env.rollouts.settings import (
    DEFAULT_CONCURRENCY,
    ENDPOINT_DEFAULTS,
    LOCAL_DEFAULTS,
    RolloutSettings,
)

__all__ = ["cmd_rollouts", "rollouts_arguments", "settings_of"]

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RolloutSettings)}


def rollouts_arguments(p: argparse.ArgumentParser) -> None:
    """``rollouts``' arguments (this module imports what the run needs only when it runs: ``--help`` stays quick)."""
    describe(p, "Run each task of a JSONL dataset through a policy against resources servers and write one "
             "row per rollout (NeMo Gym's format: the /verify reply plus _ng_task_index and _ng_rollout_index). "
             "Servers are launched by the command (bundled NAMEs, +config_paths=[...], or, when none is named, every "
             "bundled server that judges its episodes: the hosted Gymnasium and TextArena envs run when named) or "
             "already running (--head-url, --server-url).",
             "rollouts", "rollouts --policy openai            # endpoint from env.yaml",
             "rollouts example_multi_step --policy scripted --num-repeats 4",
             "rollouts --head-url http://127.0.0.1:11000 --input tasks.jsonl --policy openai --resume")
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    where = p.add_argument_group("servers and data")
    where.add_argument("--server", action="append", metavar="NAME", help="a server to use (repeatable); its example data by default")
    where.add_argument("--head-url", metavar="URL", help="use the servers of a running head server (GET /servers)")
    where.add_argument("--server-url", metavar="URL", help="use one running resources server")
    where.add_argument("--input", "-i", metavar="PATH", help="tasks JSONL (NeMo Gym rows); default: the servers' example data")
    where.add_argument("--output", "-o", metavar="PATH", default=_DEFAULTS["output"], help=f"output JSONL (default {_DEFAULTS['output']})")
    where.add_argument("--limit", type=int, metavar="N", help="only the first N valid tasks of each dataset")
    where.add_argument("--strict", action="store_true", help="stop on an invalid row instead of skipping it")
    where.add_argument("--log-dir", metavar="DIR", help="keep the logs of launched servers here")
    add_env_yaml(where)
    pol = p.add_argument_group("policy")
    pol.add_argument("--policy", choices=POLICY_KINDS, help="default: local when torch is installed")
    pol.add_argument("--model", metavar="NAME", help="model name (openai) or path/id (local); env.yaml: policy_model_name")
    pol.add_argument("--base-url", metavar="URL", help="OpenAI-compatible endpoint; env.yaml: policy_base_url")
    pol.add_argument("--api-key", metavar="KEY", help="API key; env.yaml: policy_api_key (safer than the command line)")
    pol.add_argument("--api", choices=("responses", "chat"), default=_DEFAULTS["api"],
                     help="openai: the Responses API (default) or Chat Completions")
    pol.add_argument("--device", metavar="DEV", help="local: cpu (default), cuda or cuda:N")
    pol.add_argument("--dtype", choices=LOCAL_DTYPES,
                     help="local: the weights' dtype (default auto: bfloat16 where the CPU or GPU computes it natively, "
                          "else float32); int8: bfloat16 with int8 weights for decoding, on the CPU")
    pol.add_argument("--seed", type=int, help="local: makes sampling reproducible")
    pol.add_argument("--temperature", type=float,
                     help=f"override responses_create_params.temperature (local: {LOCAL_DEFAULTS['temperature']:g}, greedy)")
    pol.add_argument("--top-p", type=float, help="override responses_create_params.top_p")
    pol.add_argument("--max-output-tokens", type=int, metavar="N",
                     help=f"override responses_create_params.max_output_tokens (local: {LOCAL_DEFAULTS['max_output_tokens']})")
    run = p.add_argument_group("run")
    run.add_argument("--num-repeats", type=int, default=_DEFAULTS["num_repeats"], metavar="N", help=f"rollouts per task (default {_DEFAULTS['num_repeats']})")
    run.add_argument("--concurrency", type=int, metavar="N",
                     help=f"rollouts in flight (default {DEFAULT_CONCURRENCY}; {LOCAL_DEFAULTS['concurrency']} with the local policy)")
    run.add_argument("--max-steps", type=int, default=_DEFAULTS["max_steps"], metavar="N", help=f"model turns per episode (default {_DEFAULTS['max_steps']})")
    run.add_argument("--max-episode-tokens", type=int, metavar="N",
                     help="generated tokens an episode may use; then it is scored as it stands "
                          f"(default: none; local: {LOCAL_DEFAULTS['max_episode_tokens']})")
    run.add_argument("--timeout", type=float, default=_DEFAULTS["timeout"], metavar="S", help=f"server request timeout (default {_DEFAULTS['timeout']:g} s)")
    run.add_argument("--attempt-timeout", type=float, metavar="S",
                     help=f"openai: each HTTP attempt's timeout (default {ENDPOINT_DEFAULTS['attempt_timeout']:g} s); "
                          "timed-out attempts are retried within the turn's deadline")
    run.add_argument("--turn-timeout", type=float, metavar="S",
                     help="the deadline of one model turn, retries and their waits included (default: "
                          f"{ENDPOINT_DEFAULTS['turn_timeout']:g} s for openai, none for local and scripted)")
    run.add_argument("--first-reply-timeout", type=float, default=300.0, metavar="S",
                     help="openai: before the first rollout, how long to wait for the endpoint's first reply (a "
                          "server may load its model at its first request); the turn limits apply after it "
                          "(default 300 s; 0: no wait)")
    run.add_argument("--episode-reward", choices=("verify", "sum"), default="verify",
                     help="a row's reward: the /verify reward (default), or sum: plus the tools' step rewards")
    run.add_argument("--resume", action="store_true", help="continue the output file: skip rollouts already in it")
    run.add_argument("--allow-changes", action="store_true",
                     help="with --resume: add rows even if the file was written with other settings "
                          "(repeats, policy, sampling, a changed dataset)")


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
    from nemo_gym_env.launch.config import config_value
    from nemo_gym_env.rollouts.output import failures_path, metrics_path
    from nemo_gym_env.rollouts.plan import plan_rollouts
    from nemo_gym_env.rollouts.report import metrics_table, write_metrics
    from nemo_gym_env.rollouts.runner import open_output, run_plan
    from nemo_gym_env.system.processes import sigterm_raises

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
