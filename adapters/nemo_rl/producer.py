"""The rollout producer NeMo RL's GRPO drives: NeMo Gym's actor surface over our servers and policies.

NeMo RL's GRPO drives NeMo Gym through a Ray actor (``nemo_rl.environments.nemo_gym.NemoGym``)
whose ``run_rollouts(rows, timer_prefix, ...)`` is an async generator of
``(row["_rowidx"], result, timing)``; GRPO reads ``result["message_log"]``,
``result["input_message_log"]`` and ``result["full_result"]["reward"]``.
:class:`NemoGymRollouts` keeps that contract: each row is played by
:func:`~nemo_gym_env.rollouts.jobs.run_rollout` against the resources server it names, and its
``/verify`` reply becomes NeMo RL's result (:func:`~nemo_gym_env.adapters.nemo_rl.results.to_nemo_rl_result`).
The servers are launched (locally or on Ray nodes), named by URL, or found through a head
server, all by the library's own launcher, catalog, configs and head client.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nemo_gym_env.adapters.nemo_rl.policy import PolicySource, build_policy, default_policies
from nemo_gym_env.adapters.nemo_rl.results import to_nemo_rl_result
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.envs.sources import ServerSet
from nemo_gym_env.errors import NemoRLFormatError, RolloutFailed
from nemo_gym_env.policies.base import Policy
from nemo_gym_env.protocol.defaults import MAX_STEPS, TRAINER_CONCURRENCY, TRAINER_REQUEST_TIMEOUT_S
from nemo_gym_env.protocol.keys import FAILURE_CLASS_KEY, TASK_INDEX_KEY
from nemo_gym_env.ray_cluster.connection import RAY_ADDRESS_KEY
from nemo_gym_env.ray_cluster.servers import RayLauncher
from nemo_gym_env.rollouts.jobs import RolloutJob, RolloutOptions, ServerClients, run_rollout
from nemo_gym_env.rollouts.output import is_failure
from nemo_gym_env.rollouts.plan import route_row

__all__ = ["ROW_INDEX_KEY", "NemoGymRollouts", "ProducerSettings"]

log = logging.getLogger(__name__)

ROW_INDEX_KEY = "_rowidx"
"""NeMo RL's stable row index, set on every row it sends to ``run_rollouts``."""

HEALTH_TIMEOUT_S = 10.0


@dataclass
class ProducerSettings:
    """What ``env.nemo_gym`` (NeMo RL's ``initial_global_config_dict``) may set for our actor.

    See :class:`NemoGymRollouts` for each key.
    """

    servers: tuple[str, ...] = ()
    config_paths: tuple[str, ...] = ()
    server_urls: dict[str, str] | None = None
    head_url: str | None = None
    placement: str = "local"
    server_host: str | None = None
    policy: dict[str, Any] | None = None
    concurrency: int = TRAINER_CONCURRENCY
    max_steps: int = MAX_STEPS
    max_attempts: int = 2
    request_timeout_s: float = TRAINER_REQUEST_TIMEOUT_S
    turn_timeout_s: float | None = None
    tensors: bool | None = None
    ray_head_node_address: str | None = None

    @classmethod
    def from_block(cls, block: Mapping[str, Any]) -> ProducerSettings:
        """The settings of an ``env.nemo_gym`` block; keys that are not settings are ignored.

        Raises:
            ValueError: A setting out of range.
        """
        known = set(cls.__dataclass_fields__)
        values = {k: block[k] for k in known if block.get(k) is not None}
        for key in ("servers", "config_paths"):
            if key in values:
                value = values[key]
                values[key] = (value,) if isinstance(value, str) else tuple(str(v) for v in value)
        settings = cls(**values)
        if settings.placement not in ("local", "ray"):
            raise ValueError(f"env.nemo_gym.placement must be 'local' or 'ray', got {settings.placement!r}")
        if settings.concurrency < 1 or settings.max_steps < 1 or settings.max_attempts < 1:
            raise ValueError("env.nemo_gym.concurrency, max_steps and max_attempts must be >= 1")
        return settings


class NemoGymRollouts:
    """The rollout producer NeMo RL's GRPO drives, over our resources servers and policies.

    Same surface as ``nemo_rl.environments.nemo_gym.NemoGym``: construct with NeMo RL's
    ``NemoGymConfig`` (``model_name``, ``base_urls``, ``initial_global_config_dict`` = the
    ``env.nemo_gym`` block), then ``_spinup()``, ``set_tokenizer(...)``, ``run_rollouts(...)``,
    ``health_check()``, ``shutdown()``. ``run_rollouts`` spins up by itself when needed, so an
    actor that Ray restarted works again.

    The ``env.nemo_gym`` block (all optional): ``servers`` (bundled server names to launch),
    ``config_paths`` (our/NeMo Gym server YAMLs to launch), ``server_urls`` (``{name: url}`` of
    running servers) or ``head_url``; ``placement`` (``local``: server processes next to the
    actor, on loopback; ``ray``: servers spread over the cluster as Ray actors, on their
    nodes' addresses or ``server_host``); ``policy`` (overrides of
    the default policy, an OpenAI-compatible chat client with token data against ``base_urls``
    and ``model_name`` that sends NeMo RL's ``required_prefix_token_ids`` with each call
    (``pin_prefix: false`` turns that off); ``kind: local`` for a LocalPolicy); ``concurrency`` (episodes in
    flight), ``max_steps``, ``max_attempts`` (a failed rollout is retried before the batch
    fails), ``request_timeout_s``, ``turn_timeout_s``, ``tensors`` (token data as torch
    tensors, default when torch is importable). Instance blocks in it
    (``math: {resources_servers: {math: {...}}}``) override the launched servers' configs.
    NeMo RL's own keys (``port_range_low``...) are ignored.

    Args:
        cfg: NeMo RL's ``NemoGymConfig`` (a dict), or None.
        policy: Overrides the policy (a :class:`~nemo_gym_env.policies.base.Policy`, a factory, or
            a ``make_policy`` spec).
        servers: ``{name: url}`` of running servers; overrides the config.

    Rows: each row is a NeMo Gym dataset row plus NeMo RL's ``_rowidx``; ``agent_ref.name``
    names the server (or an agent whose ``resources_server`` names it); with one server it
    may be omitted.

    Example::

        producer = NemoGymRollouts(servers={"math": url}, policy=LocalPolicy(temperature=1.0))
        async for row_index, result, timing in producer.run_rollouts(rows, "timing/rollout"):
            ...
    """

    def __init__(self, cfg: Mapping[str, Any] | None = None, *, policy: PolicySource | None = None,
                 servers: Mapping[str, str] | None = None):
        cfg = dict(cfg or {})
        block = dict(cfg.get("initial_global_config_dict") or {})
        self.cfg = cfg
        self.settings = ProducerSettings.from_block(block)
        self._options = RolloutOptions(max_steps=self.settings.max_steps, turn_timeout_s=self.settings.turn_timeout_s)
        self._block = block
        self._policy_source = policy
        self._server_override = dict(servers) if servers else None
        self.servers: dict[str, str] = {}
        self._routes: dict[str, str] = {}
        self._policies: list[Policy] = []
        self._launched = ServerSet()
        self._clients = ServerClients({})
        self.tokenizer: Any = None
        self._ready = False

    # ---- NeMo RL's actor surface -----------------------------------------------------------

    def _spinup(self) -> None:
        """Launch or find the servers and build the policies (idempotent)."""
        if self._ready:
            return
        self.servers = self._find_servers()
        if not self.servers:
            raise ValueError("no resources server: set env.nemo_gym.servers, config_paths, server_urls or head_url")
        self._clients = ServerClients(self.servers, timeout_s=self.settings.request_timeout_s)
        self._policies = self._make_policies()
        if self._tensors():
            importlib.import_module("torch")  # now, not inside the first batch's timing
        self._ready = True
        log.info("nemo_gym_env rollouts ready: servers %s, policy %s", self.servers,
                 ", ".join(p.name for p in self._policies))

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Keep NeMo RL's tokenizer (our policies bring their own token ids; kept for parity)."""
        self.tokenizer = tokenizer

    def health_check(self) -> None:
        """Raise if a resources server does not answer ``GET /``."""
        self._spinup()
        names = list(self.servers)
        answers = background_loop().run(self._health(names))
        for name, ok in zip(names, answers):
            if not ok:
                raise RuntimeError(f"resources server {name!r} at {self.servers[name]} does not answer GET /")

    def shutdown(self) -> None:
        """Stop the servers this producer launched; safe to call twice."""
        self._launched.close()
        self._ready = False

    async def run_rollouts(self, rows: Sequence[dict[str, Any]], timer_prefix: str = "timing/rollout",
                           deduplicate_multimodal_data: bool = False,
                           *_: Any, **__: Any) -> AsyncIterator[tuple[int, dict[str, Any], dict[str, float]]]:
        """Play every row, concurrently; yield ``(row["_rowidx"], result, timing)`` as episodes finish.

        ``timing`` holds cumulative ``<timer_prefix>/await_results`` (seconds spent waiting for
        episodes), ``/postprocess_results`` and ``/postprocess_results_pct``: the last one
        yielded covers the whole batch. A row whose rollout fails ``max_attempts`` times raises
        :class:`~nemo_gym_env.errors.RolloutFailed`, unless it was played to the end and only its
        verifier could not judge it (a verify timeout, a lost verifier task): then its result has
        ``mask_sample: true`` (out of the loss, as NeMo Gym does) and reward 0.0 that is no score; and an episode NeMo RL would reject raises
        :class:`~nemo_gym_env.errors.NemoRLFormatError`, both naming the row; the rollouts still
        in flight are cancelled. ``deduplicate_multimodal_data`` is accepted for NeMo RL's
        signature (text only here).

        Raises:
            ValueError: An empty batch, or a row that names no known server.
        """
        if not rows:
            raise ValueError("the rollout batch must not be empty")
        self._spinup()
        launcher = self._launched.launcher
        if isinstance(launcher, RayLauncher):  # a server placed again after its node was lost: follow it
            moved = self._clients.retarget(launcher.urls)
            self.servers.update({name: launcher.urls[name] for name in moved})
        jobs = [self._job(position, row) for position, row in enumerate(rows)]
        slots = asyncio.Semaphore(self.settings.concurrency)
        tensors = self._tensors()
        waited = postprocessed = 0.0
        started = time.perf_counter()

        async def play(job: RolloutJob) -> dict[str, Any]:
            async with slots:
                return await self._play(job)

        tasks = {asyncio.ensure_future(play(job)): row_index for row_index, job in jobs}
        try:
            pending = set(tasks)
            while pending:
                mark = time.perf_counter()
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                waited += time.perf_counter() - mark
                for task in done:
                    mark = time.perf_counter()
                    row_index = tasks[task]
                    result = self._result(row_index, task.result(), tensors)
                    postprocessed += time.perf_counter() - mark
                    total = max(time.perf_counter() - started, 1e-9)
                    timing = {f"{timer_prefix}/await_results": waited,
                              f"{timer_prefix}/postprocess_results": postprocessed,
                              f"{timer_prefix}/postprocess_results_pct": 100 * postprocessed / total}
                    yield row_index, result, timing
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- playing ---------------------------------------------------------------------------

    def _job(self, position: int, row: dict[str, Any]) -> tuple[int, RolloutJob]:
        row_index = row.get(ROW_INDEX_KEY, position)
        if isinstance(row_index, bool) or not isinstance(row_index, int):
            raise TypeError(f"row {position}: {ROW_INDEX_KEY} must be an int, got {row_index!r}")
        try:
            name = route_row(row, self.servers, self._routes)
        except ValueError as exc:
            raise ValueError(f"row {row_index}: {exc}; set agent_ref.name to a server (or an agent whose "
                             "resources_server names one)") from None
        task_index = row.get(TASK_INDEX_KEY, row_index)
        policy = self._policies[row_index % len(self._policies)]  # one base URL per episode: prefix caching
        return row_index, RolloutJob(row, int(task_index), 0, self._clients[name], policy, name)

    async def _play(self, job: RolloutJob) -> dict[str, Any]:
        reasons = []
        row: dict[str, Any] = {}
        for _ in range(self.settings.max_attempts):
            row = await run_rollout(job, self._options)
            if not is_failure(row):
                return row
            reasons.append(f"{row.get(FAILURE_CLASS_KEY)}: {row.get('failure_reason')}")
        if row.get("failure_kind") and isinstance(row.get("response"), dict):
            # Played to the end, but the verifier could not judge it on any attempt: NeMo Gym's way,
            # the slot is filled and masked out of the loss (mask_sample), never scored as the model's.
            log.warning("row %s (server %r): no judgement after %d attempt(s), masked: %s",
                        job.row.get(ROW_INDEX_KEY, job.task_index), job.server, len(reasons), reasons[-1][:500])
            return {**job.row, "response": row["response"], "reward": 0.0, "mask_sample": True,
                    "failure_kind": row["failure_kind"], "failure_reason": row.get("failure_reason")}
        raise RolloutFailed(f"row {job.row.get(ROW_INDEX_KEY, job.task_index)} (server {job.server!r}) failed "
                            f"{len(reasons)} time(s); last: {reasons[-1][:1500]}")

    def _result(self, row_index: int, row: dict[str, Any], tensors: bool) -> dict[str, Any]:
        try:
            return to_nemo_rl_result(row, tensors=tensors,
                                     invalid_tool_call_patterns=self.cfg.get("invalid_tool_call_patterns"),
                                     thinking_tags=self.cfg.get("thinking_tags"))
        except NemoRLFormatError as exc:
            raise NemoRLFormatError(f"row {row_index} (task {row.get(TASK_INDEX_KEY)}): {exc}") from None

    async def _health(self, names: list[str]) -> list[bool]:
        return await asyncio.gather(*(self._clients[name].health(timeout_s=HEALTH_TIMEOUT_S) for name in names))

    def _tensors(self) -> bool:
        if self.settings.tensors is not None:
            return bool(self.settings.tensors)
        return importlib.util.find_spec("torch") is not None

    def _make_policies(self) -> list[Policy]:
        if self._policy_source is not None:
            return [build_policy(self._policy_source)]
        return default_policies(self.settings.policy, self.cfg.get("base_urls"), self.cfg.get("model_name"))

    # ---- servers ---------------------------------------------------------------------------

    def _find_servers(self) -> dict[str, str]:
        settings = self.settings
        if self._server_override:
            return ServerSet.running(self._server_override).urls
        running = ServerSet.running(settings.server_urls, head_url=settings.head_url or None)
        self._launched = self._to_launch()
        self._routes = self._launched.routes
        if self._launched:
            launcher = RayLauncher(host=settings.server_host) if settings.placement == "ray" else None
            self._launched.start(launcher=launcher)
        return (running | self._launched).urls

    def _to_launch(self) -> ServerSet:
        """The servers to launch: bundled ones and those of ``config_paths``, with the block's overrides."""
        servers = ServerSet.launching(self.settings.servers, config_paths=self.settings.config_paths or ())
        address = self.settings.ray_head_node_address or self._ray_address()
        for server in servers:
            spec = server.spec
            override = (((self._block.get(spec.instance_name) or {}).get(spec.server_type) or {})
                        .get(spec.impl_name) or {})
            config = {**spec.config, **dict(override)}
            if address:
                config.setdefault(RAY_ADDRESS_KEY, address)  # NeMo Gym's global key, per server here
            server.spec = replace(spec, config=config)
        return servers

    def _ray_address(self) -> str | None:
        """The cluster this process is connected to, if any (without importing ray)."""
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return None
        return ray.get_runtime_context().gcs_address

