"""Running a planned rollouts run: launch what is needed, play the missing rollouts, write each row.

:func:`run_plan` is the whole of ``nemo-gym-env rollouts`` after planning::

    plan = plan_rollouts(settings)
    with open_output(plan) as writer:
        stopped = run_plan(plan, writer)
    summary = write_metrics(settings.output)

SIGINT and SIGTERM stop a run cleanly: the rollouts in flight are cancelled, every finished row
is already on disk, the servers it launched are stopped, and :func:`run_plan` returns the signal
(a second signal exits at once). ``--resume`` then runs only what is missing. A policy that
finds its model unreachable (:attr:`~nemo_gym_env.policies.base.Policy.unreachable`: an
endpoint that refuses every connection) stops the run the same way, with
:class:`~nemo_gym_env.errors.EndpointUnreachable`, rather than failing every rollout alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path

from nemo_gym_env.envs.traits import ServerTraits, server_traits
from nemo_gym_env.errors import EndpointUnreachable, Stopped, UsageError
from nemo_gym_env.policies.base import Policy
from nemo_gym_env.rollouts.jobs import Planned, RolloutJob, ServerClients, collect_jobs, expand
from nemo_gym_env.rollouts.manifest import differences, read_manifest, write_manifest
from nemo_gym_env.rollouts.output import RolloutWriter, failures_path
from nemo_gym_env.rollouts.plan import RolloutPlan
from nemo_gym_env.rollouts.report import Progress

__all__ = ["open_output", "run_plan"]


def open_output(plan: RolloutPlan, *, secrets: Iterable[str] = (),
                say: Callable[[str], None] = lambda message: None) -> RolloutWriter:
    """The run's :class:`RolloutWriter`, after checking a resume against the file's manifest.

    A fresh run starts the file (and its sidecars) over; a resume keeps its rows, and is refused
    when the file was written with settings that make the new rows incomparable (see
    :mod:`~nemo_gym_env.rollouts.manifest`) unless ``allow_changes`` is set. Either way this
    run's manifest is recorded before the first row is written.

    Raises:
        UsageError: a resume with other settings, naming every difference.
    """
    settings = plan.settings
    output = Path(settings.output)
    manifest = plan.manifest()
    written = any(path.is_file() and path.stat().st_size for path in (output, failures_path(output)))
    if settings.resume and written:  # (an empty file holds nothing its settings could disagree with)
        old = read_manifest(output)
        if old is None:
            say(f"{output} has no run manifest (written by an older version): its settings are not checked")
        else:
            changed = differences(old, manifest)
            if changed and not settings.allow_changes:
                raise UsageError(f"--resume: {output} was written with other settings: {'; '.join(changed)}. "
                                 "Write to another --output, or pass --allow-changes to add rows anyway")
            for difference in changed:
                say(f"resuming despite a difference (--allow-changes): {difference}")
            manifest = manifest.merged(old)
    writer = RolloutWriter(output, resume=settings.resume, secrets=secrets)
    write_manifest(output, manifest)
    return writer


def run_plan(plan: RolloutPlan, writer: RolloutWriter, *, say: Callable[[str], None] = lambda message: None,
             ) -> list[int]:
    """Launch what is needed and run the missing rollouts into ``writer``; returns the stop signal, if any.

    ``say`` receives one-line notes for a person (servers started, what will run).
    """
    settings, targets = plan.settings, plan.targets
    repeats = settings.num_repeats
    expected = plan.num_tasks * repeats
    # What is missing, by identity (server, task, repeat): whatever else the file holds, and
    # whichever order the tasks come in, exactly these run.
    todo = {n: list(expand(t.tasks, repeats, sampling=settings.sampling, is_done=writer.is_done))
            for n, t in targets.items()}
    remaining = sum(len(planned) for planned in todo.values())
    stopped: list[int] = []
    if not remaining:  # nothing to play: no model loads, no server starts
        say(f"{expected} rollout(s), 0 to run: {writer.path} holds them all (no model loads, no server starts)")
        return stopped
    try:
        plan.start_loading()  # a local model loads while the servers start
        to_launch = [n for n, tasks in todo.items() if tasks and targets[n].url is None]
        if to_launch:
            started = time.monotonic()
            plan.servers.start(to_launch, stream_logs=settings.stream_logs, log_dir=settings.log_dir)
            say(f"started {len(to_launch)} server(s) in {time.monotonic() - started:.1f} s")
        plan.ready()  # a model loading meanwhile (plan_rollouts(background=True))
        say(f"{expected} rollout(s), {remaining} to run: {expected // repeats} task(s) x {repeats} on "
            f"{', '.join(targets)}; policy {plan.describe_policy()}; output {writer.path}")
        clients = ServerClients({n: t.url for n, t in targets.items() if t.url is not None}, timeout_s=settings.timeout)

        async def jobs() -> Iterator[RolloutJob]:
            await _first_reply(plan, say)
            order = await _longest_first(todo, clients)
            return (RolloutJob.of(planned, clients[n], plan.policies[n], n) for n, planned in order)

        progress = Progress(expected, initial=expected - remaining)
        try:
            asyncio.run(_collect(jobs, writer, progress, plan, stopped))
        except asyncio.CancelledError:
            if not stopped:
                raise
        finally:
            progress.close()
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Stopped
        stopped.append(exc.signum if isinstance(exc, Stopped) else signal.SIGINT)
    finally:
        plan.servers.close()
    return stopped


async def _first_reply(plan: RolloutPlan, say: Callable[[str], None], quiet_s: float = 2.0) -> None:
    """Before the first rollout, wait up to ``first_reply_timeout`` for each endpoint's first answer (a
    server may load its model at its first request); the per-turn limits apply from then on. The wait
    is said on the progress line once it passes ``quiet_s``. Policies with no endpoint: nothing."""
    timeout_s = plan.settings.first_reply_timeout
    endpoints = {id(p): p for p in plan.policies.values() if hasattr(p, "first_reply")}
    if not timeout_s or not endpoints:
        return
    for policy in endpoints.values():
        probe = asyncio.ensure_future(policy.first_reply(timeout_s))
        done, _ = await asyncio.wait({probe}, timeout=quiet_s)
        if not done:
            say(f"waiting for the endpoint's first reply ({policy.name}; up to {timeout_s:g} s, "
                "--first-reply-timeout: a server may load its model at its first request) ...")
        outcome, took = await probe
        if outcome == "answered":
            say(f"{policy.name} answered its first request in {took:.1f} s")
        elif outcome == "silent":
            say(f"no first reply from {policy.name} in {timeout_s:g} s; the rollouts go on under the per-turn limits")


async def _longest_first(todo: dict[str, list[Planned]], clients: ServerClients) -> list[tuple[str, Planned]]:
    """The run's tasks, those whose episodes run longest first, so the batch stays full to the end.

    A game (a Gymnasium-protocol server) plays several turns, a task that offers tools usually a
    few, any other task one: started in that order, the many-turn episodes are under way while
    the one-turn ones fill the batch, and no long episode is left to run alone at the end. The
    order within each kind is the dataset's.
    """
    names = [n for n, tasks in todo.items() if tasks]
    traits = await asyncio.gather(*(server_traits(clients[n]) for n in names), return_exceptions=True)
    games = {n for n, t in zip(names, traits) if isinstance(t, ServerTraits) and t.protocol == "gymnasium"}

    def turns(entry: tuple[str, Planned]) -> int:
        name, planned = entry
        if name in games:
            return 0
        return 1 if planned.row.get("responses_create_params", {}).get("tools") else 2

    return sorted(((n, planned) for n, each in todo.items() for planned in each), key=turns)


async def _collect(make_jobs: Callable[[], Awaitable[Iterator[RolloutJob]]], writer: RolloutWriter,
                   progress: Progress, plan: RolloutPlan, stopped: list[int]) -> None:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    settings = plan.settings

    def on_signal(signum: int) -> None:
        if not stopped:
            stopped.append(signum)
            main_task.cancel()
        else:  # a second signal: stop waiting for anything
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            os._exit(128 + signum)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        rows = collect_jobs(await make_jobs(), settings.options, concurrency=settings.concurrency)
        async with contextlib.aclosing(rows):
            async for row in rows:
                writer.write(row)
                progress.update(row)
                down = next((p.unreachable for p in plan.policies.values() if p.unreachable), None)
                if down is not None:
                    raise EndpointUnreachable(f"{down}. Stopped the run after {progress.count} rollout(s); "
                                              "rerun with --resume once it answers")
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
        await _close_all(plan.policies.values())


async def _close_all(policies: Iterable[Policy]) -> None:
    for policy in {id(p): p for p in policies}.values():
        with contextlib.suppress(Exception):  # closing must not hide how the run ended
            await policy.aclose()
