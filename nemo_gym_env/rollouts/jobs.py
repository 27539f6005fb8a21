"""One rollout, and many at once: a task played through a policy against a resources server.

:func:`run_rollout` plays one :class:`RolloutJob` (seed, policy turns and tool calls, verify)
and never raises for a failing policy or server: it returns a failure row instead (see
:data:`~nemo_gym_env.protocol.keys.FAILURE_CLASS_KEY`), also for a ``/verify`` reply that
judged nothing (a verify timeout, a lost verifier: :mod:`~nemo_gym_env.protocol.failures`),
which is never a row with reward 0. :func:`collect_jobs` runs many,
``concurrency`` at a time, drawing jobs lazily; :func:`collect` is the one-server shortcut::

    async for row in collect(rows, ScriptedPolicy("example_multi_step"), url, num_repeats=4):
        ...

What a run plays is worked out once, here, for one machine (``rollouts``, :func:`collect`) and for Ray
(``ray_collect``) alike: :func:`expand` turns tasks into the rollouts still to play (tasks x repeats,
less those already done, sampling overrides applied), and
:class:`~nemo_gym_env.rollouts.settings.RolloutOptions` says how each is played (turn and token limits,
the reward): made once per run and handed to every worker whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.traits import start_episode
from nemo_gym_env.errors import ActionError, ConnectFailed, PolicyTimeout, ServerError, VerifyFailed
from nemo_gym_env.policies.base import Policy, PolicyRequest
from nemo_gym_env.protocol.defaults import CONCURRENCY, MAX_STEPS, ROLLOUT_REQUEST_TIMEOUT_S
from nemo_gym_env.protocol.keys import (
    AGENT_REF_KEY,
    FAILURE_CLASS_KEY,
    TASK_INDEX_KEY,
)
from nemo_gym_env.rollouts.identity import server_of, stamp, task_key, task_keys
from nemo_gym_env.rollouts.settings import RolloutOptions

__all__ = ["DEADLINE_GRACE_S", "UNREACHABLE", "Planned", "RolloutJob", "RolloutOptions", "ServerClients", "Task",
           "apply_sampling", "collect", "collect_jobs", "expand", "run_rollout", "skipping"]

DEADLINE_GRACE_S = 1.0
"""How long past ``turn_timeout_s`` a turn is cut off here: a policy that keeps the deadline itself
(the openai policy) ends first and says why (a timeout, or a 429 it would not wait out); this
only stops one that does not."""


def apply_sampling(row: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The row with sampling overrides merged into ``responses_create_params`` (NeMo Gym's semantics).

    Example:
        >>> apply_sampling({"responses_create_params": {"input": "hi", "temperature": 1.0}}, {"temperature": 0.2})
        {'responses_create_params': {'input': 'hi', 'temperature': 0.2}}
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if not overrides:
        return row
    return {**row, "responses_create_params": {**row["responses_create_params"], **overrides}}


@dataclass(frozen=True)
class Task:
    """One task of a run: its row as the dataset holds it, its index there, its identity."""

    index: int
    """``_ng_task_index``: the row's own, or its position among the valid rows of its dataset."""
    key: str
    """``_ng_task_key``: the digest of its content (:mod:`~nemo_gym_env.rollouts.identity`)."""
    row: dict[str, Any]
    server: str
    """The name its rollout rows carry in ``agent_ref``: the row's own, else the target's."""


@dataclass(frozen=True)
class Planned:
    """One rollout still to play: its task, its repeat, and the row as the policy gets it (sampling applied)."""

    task: Task
    rollout_index: int
    row: dict[str, Any]


def expand(tasks: Iterable[Task], num_repeats: int, *, sampling: Mapping[str, Any] | None = None,
           is_done: Callable[[str, str, int, int], bool] = lambda server, key, index, rollout: False,
           ) -> Iterator[Planned]:
    """The rollouts a run still has to play: each task ``num_repeats`` times, in the tasks' order then the repeat's,
    less those ``is_done(server, task key, task index, rollout index)`` says are done (a resumed file's).

    The one expansion of a run, on one machine (``rollouts``, :func:`collect`) and on Ray (``ray_collect``).
    """
    for task in tasks:
        prepared = apply_sampling(task.row, sampling)
        for rollout_index in range(num_repeats):
            if not is_done(task.server, task.key, task.index, rollout_index):
                yield Planned(task, rollout_index, prepared)


def skipping(done: Iterable[tuple[str, str, int]]) -> Callable[[str, str, int, int], bool]:
    """``is_done`` for :func:`expand` from identities ``(server, task key, rollout index)``."""
    done = set(done)
    return lambda server, key, index, rollout: (server, key, rollout) in done


class ServerClients:
    """One :class:`~nemo_gym_env.client.resources.ResourcesClient` per server name, made on first use.

    Every rollout of a server shares its client (and so its connections); each episode keeps
    its own cookies.

    Args:
        urls: Server name -> base URL.
        timeout_s: Timeout of every request, ``/verify`` included.
    """

    def __init__(self, urls: Mapping[str, str], *, timeout_s: float = ROLLOUT_REQUEST_TIMEOUT_S):
        self.urls = dict(urls)
        self.timeout_s = timeout_s
        self._clients: dict[str, ResourcesClient] = {}

    def __getitem__(self, name: str) -> ResourcesClient:
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = ResourcesClient(self.urls[name], timeout_s=self.timeout_s,
                                                          verify_timeout_s=self.timeout_s)
        return client

    def retarget(self, urls: Mapping[str, str]) -> list[str]:
        """Point servers at new URLs (a server placed again elsewhere); returns the names that moved.

        Rollouts already playing keep the client they started with; the next ones use the new URL.
        """
        moved = [name for name, url in urls.items() if self.urls.get(name) != url]
        for name in moved:
            self.urls[name] = urls[name]
            self._clients.pop(name, None)
        return moved


@dataclass
class RolloutJob:
    """One rollout to run: a task row, its indices, where and with what.

    Attributes:
        row: The task row (sampling overrides already applied).
        task_index: ``_ng_task_index`` of the output row.
        rollout_index: ``_ng_rollout_index`` of the output row.
        client: The resources server's client.
        policy: The policy playing the model.
        server: The server's name, recorded as ``agent_ref`` when the row has none.
        task_key: The task's identity (:mod:`~nemo_gym_env.rollouts.identity`), from the row as
            the dataset holds it; None: the digest of ``row``.
    """

    row: dict[str, Any]
    task_index: int
    rollout_index: int
    client: ResourcesClient
    policy: Policy
    server: str | None = None
    task_key: str | None = None

    @property
    def key(self) -> tuple[int, int]:
        """``(task_index, rollout_index)``."""
        return self.task_index, self.rollout_index

    @classmethod
    def of(cls, planned: Planned, client: ResourcesClient, policy: Policy, server: str | None) -> RolloutJob:
        """The job that plays ``planned`` on ``client`` (``server``: the name recorded when the row names none)."""
        return cls(planned.row, planned.task.index, planned.rollout_index, client, policy, server, planned.task.key)


def _stamp(job: RolloutJob, row: dict[str, Any]) -> dict[str, Any]:
    ref = job.row.get(AGENT_REF_KEY)
    if ref is None and job.server is not None:
        ref = {"type": "resources_servers", "name": job.server}
    return stamp(row, task_index=job.task_index, key=job.task_key if job.task_key is not None else task_key(job.row),
                 rollout_index=job.rollout_index, agent_ref=ref)


UNREACHABLE = "server_unreachable"
"""``failure_kind`` of a failure row whose server could not be reached when the episode began: nothing
was sent or played, so the rollout can be played again as it is (``ray_collect`` does, while it waits
for a lost server to be placed again)."""


def _failure(job: RolloutJob, kind: str, reason: str, **extra: Any) -> dict[str, Any]:
    return _stamp(job, {FAILURE_CLASS_KEY: kind, "failure_reason": reason[:2000], "server_url": job.client.base_url,
                        **extra})


def _verify_failure(job: RolloutJob, error: VerifyFailed) -> dict[str, Any]:
    """A ``/verify`` reply that judged nothing: a failure row with its kind and the episode, never a reward."""
    extra: dict[str, Any] = {"failure_kind": error.kind}
    if "response" in error.reply:
        extra["response"] = error.reply["response"]  # what was played, for whoever looks into it
    return _failure(job, "server_error", str(error), **extra)


async def run_rollout(job: RolloutJob, options: RolloutOptions | None = None) -> dict[str, Any]:
    """Play one episode: seed the session, alternate policy turns and tool calls, verify.

    ``options`` (default: :class:`RolloutOptions`'s defaults) says how. ``max_episode_tokens`` bounds what
    one episode may cost: each turn may generate at most the tokens the episode has left, and once they
    are spent the episode is verified as it stands (``truncated``), as at ``max_steps``.

    The row is the ``/verify`` reply, with the per-turn ``step_rewards`` and their
    ``step_reward_sum`` when the server gave step rewards (``options.episode_reward="sum"``: ``reward``
    is the sum of both, ``verify_reward`` the server's; see :meth:`Episode.verdict`).
    Never raises for a failing policy or server: returns a failure row instead (see
    :data:`FAILURE_CLASS_KEY`). Cancellation propagates.
    """
    options = options or RolloutOptions()
    max_episode_tokens, turn_timeout_s = options.max_episode_tokens, options.turn_timeout_s
    try:
        episode, observation, info = await start_episode(job.client, "auto", job.row, job.task_index, options.max_steps,
                                                         episode_reward=options.episode_reward)
    except ServerError as exc:
        if isinstance(exc.__cause__, ConnectFailed):  # nothing reached the server: safe to play again at once
            return _failure(job, "server_error", str(exc), failure_kind=UNREACHABLE)
        return _failure(job, "server_error", str(exc))
    sampling = info["sampling"]
    while not episode.done:
        left = None if max_episode_tokens is None else max_episode_tokens - (episode.usage or {}).get("output_tokens", 0)
        if left is not None and left <= 0:
            await episode.finish()  # the episode's tokens are spent: scored as it stands
            break
        turn_sampling = dict(sampling)
        if left is not None:
            turn_sampling["max_output_tokens"] = min(left, turn_sampling.get("max_output_tokens") or left)
        request = PolicyRequest(
            input=observation, history=list(episode.trajectory), tools=episode.tools, sampling=turn_sampling,
            row=job.row,
        )
        where = f"policy {job.policy.name!r} (task {job.task_index}, rollout {job.rollout_index}, turn {episode.turn})"
        try:
            if turn_timeout_s is None:
                turn = await job.policy.generate(request)
            else:
                turn = await asyncio.wait_for(job.policy.generate(request), turn_timeout_s + DEADLINE_GRACE_S)
            items = normalize_action(turn.action(), turn=episode.turn)
            episode.add_usage(turn.input_tokens, turn.output_tokens)
        except asyncio.CancelledError:
            raise
        except PolicyTimeout as exc:
            return _failure(job, "policy_timeout", f"{where}: {exc}")
        except TimeoutError:
            return _failure(job, "policy_timeout", f"{where}: no answer within {turn_timeout_s:g} s (--turn-timeout)")
        except ActionError as exc:
            return _failure(job, "policy_error", f"{where} returned an invalid turn: {exc}")
        except Exception as exc:  # noqa: BLE001 - a failing policy fails this rollout, not the run
            return _failure(job, "policy_error", f"{where}: {type(exc).__name__}: {exc}")
        await episode.play(items)
    if isinstance(episode.error, VerifyFailed):
        return _verify_failure(job, episode.error)
    if episode.error is not None or episode.last_verify is None:
        return _failure(job, "server_error", str(episode.error or "the episode ended without a verify reply"))
    return _stamp(job, episode.verdict())


async def collect_jobs(
    jobs: Iterable[RolloutJob],
    options: RolloutOptions | None = None,
    *,
    concurrency: int = CONCURRENCY,
) -> AsyncIterator[dict[str, Any]]:
    """Run jobs concurrently on the running loop, at most ``concurrency`` at a time; yield rows as they finish.

    Every job is played with ``options``. Jobs are drawn from ``jobs`` lazily, so a huge dataset is never
    materialised as tasks.
    Closing the iterator (or cancelling its consumer) cancels the rollouts in flight.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    pending = iter(jobs)
    running: set[asyncio.Task] = set()

    def fill() -> None:
        while len(running) < concurrency:
            job = next(pending, None)
            if job is None:
                return
            running.add(asyncio.create_task(run_rollout(job, options)))

    fill()
    try:
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            running.difference_update(done)
            fill()  # refill before yielding: a slow consumer does not idle the window
            for task in done:
                yield task.result()
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


async def collect(
    rows: Sequence[dict[str, Any]],
    policy: Policy,
    server_url: str,
    *,
    num_repeats: int = 1,
    concurrency: int = CONCURRENCY,
    max_steps: int = MAX_STEPS,
    sampling: Mapping[str, Any] | None = None,
    skip: Iterable[tuple[str, str, int]] = (),
    request_timeout_s: float = ROLLOUT_REQUEST_TIMEOUT_S,
    turn_timeout_s: float | None = None,
    server_name: str | None = None,
    episode_reward: str = "verify",
) -> AsyncIterator[dict[str, Any]]:
    """Roll out every row ``num_repeats`` times against one server; yield output (or failure) rows.

    Args:
        rows: Task rows; a row's ``_ng_task_index`` is kept, otherwise its position is used.
        policy: Plays the model.
        server_url: The resources server.
        num_repeats: Rollouts per task (``_ng_rollout_index`` 0..n-1).
        concurrency: Rollouts in flight at once.
        max_steps: Model turns before an episode is verified anyway.
        sampling: Overrides of ``responses_create_params`` (``temperature``, ``top_p``, ``max_output_tokens``).
        skip: Identities already done (``RolloutWriter.done`` when resuming): ``(server, task key,
            rollout index)``, where server is the row's ``agent_ref.name`` or ``server_name``.
        request_timeout_s: Timeout of each server request.
        turn_timeout_s: The deadline of each policy turn (None: the policy's own), retries included.
        server_name: Recorded as ``agent_ref`` on rows without one.
        episode_reward: A row's ``reward``: ``"verify"`` (the server's) or ``"sum"`` (plus the step rewards).

    Yields:
        Rows in completion order; :func:`is_failure` tells failures apart.
    """
    client = ResourcesClient(server_url, timeout_s=request_timeout_s, verify_timeout_s=request_timeout_s)
    tasks = [Task(int(row.get(TASK_INDEX_KEY, position)), key, row, server_of(row) or server_name or "")
             for position, (row, key) in enumerate(zip(rows, task_keys(rows)))]
    jobs = (RolloutJob.of(planned, client, policy, server_name)
            for planned in expand(tasks, num_repeats, sampling=sampling, is_done=skipping(skip)))
    options = RolloutOptions(max_steps=max_steps, turn_timeout_s=turn_timeout_s, episode_reward=episode_reward)
    async for row in collect_jobs(jobs, options, concurrency=concurrency):
        yield row
