"""``nemo-gym-env``: serve resources servers, collect rollouts, scaffold and check, from one command.

NeMo Gym's ``ng_run`` / ``ng_collect_rollouts`` jobs, starting in seconds with no network::

    nemo-gym-env rollouts                                   # every bundled server, the local model
    nemo-gym-env rollouts --policy openai                   # the endpoint of env.yaml
    nemo-gym-env serve example_multi_step                   # servers + head server on :11000
    nemo-gym-env serve "+config_paths=[my_env/configs/my_env.yaml]" +head_server.port=0
    nemo-gym-env rollouts --head-url http://127.0.0.1:11000 --input tasks.jsonl --policy openai
    nemo-gym-env list | config NAME | validate tasks.jsonl | init my_env
    nemo-gym-env view results/rollouts.jsonl | play example_multi_step   # local web pages

Config arguments are NeMo Gym's Hydra overrides (``+config_paths=[a.yaml,b.yaml]``,
``+key=value``) merged with NeMo Gym's precedence (config files < env.yaml < command line).
Errors are one line on stderr and a non-zero exit; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import sys
import textwrap
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["build_parser", "main"]

PROG = "nemo-gym-env"
DEFAULT_OUTPUT = "results/rollouts.jsonl"
POLICY_KINDS = ("scripted", "openai", "local")
_INSTALL_LOCAL = (
    "the default policy runs the embedded local model (SmolLM2-135M-Instruct) and needs torch and "
    "transformers: `pip install torch==2.13.0 && pip install 'nemo-gym-env[trl]'` (CPU; on a GPU machine "
    "install the CUDA build of torch first). Or use an OpenAI-compatible endpoint: put policy_base_url, "
    "policy_api_key and policy_model_name in env.yaml and pass --policy openai; or --policy scripted"
)

logger = logging.getLogger("nemo_gym_env.cli")


class CliError(Exception):
    """A user error; printed as one line, exit code 1."""


class _Stop(BaseException):
    """SIGTERM, turned into an exception so that ``finally`` blocks stop everything."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---- shared helpers ----------------------------------------------------------------------------


def _err(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _split_targets(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """Positional arguments -> (bundled server names, Hydra overrides)."""
    names, overrides = [], []
    for item in items:
        (overrides if "=" in item or item.startswith("~") else names).append(item)
    return names, overrides


def _bundled_yaml(name: str) -> Path:
    from .catalog import bundled_servers, bundled_spec

    folder = bundled_servers().get(name)
    if folder is None:
        bundled_spec(name)  # raises UnknownServerError listing the available names
    return folder / "configs" / f"{name}.yaml"


def _env_yaml(args: argparse.Namespace) -> str | None:
    from .config import DEFAULT_ENV_YAML

    if getattr(args, "no_env_yaml", False):
        return None
    return getattr(args, "env_yaml", None) or DEFAULT_ENV_YAML


def _load(names: Sequence[str], overrides: Sequence[str], args: argparse.Namespace) -> Any:
    from .config import load_config

    return load_config([_bundled_yaml(n) for n in names], overrides, env_yaml=_env_yaml(args))


def _other_instances(cfg: Any) -> list[tuple[str, str]]:
    """(instance, server type) of every agent or model instance (not launched: we are the agent)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    return [
        (str(name), stype)
        for name, block in raw.items()
        if isinstance(block, dict)
        for stype in ("responses_api_agents", "responses_api_models")
        if stype in block
    ]


def _agent_routes(cfg: Any) -> dict[str, str]:
    """NeMo Gym agent instance name -> the resources server it uses (``resources_server: {name}``)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    routes = {}
    for name, block in raw.items():
        impls = block.get("responses_api_agents") if isinstance(block, dict) else None
        for impl in (impls or {}).values() if isinstance(impls, dict) else ():
            ref = impl.get("resources_server") if isinstance(impl, dict) else None
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                routes[str(name)] = ref["name"]
    return routes


def _cfg_value(cfg: Any, key: str) -> str | None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    except OmegaConfBaseException:
        return None
    return None if value in (None, "", "???") else str(value)


def _add_env_yaml(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env-yaml", metavar="PATH", help="env file with secrets and globals (default: ./env.yaml if present)")
    parser.add_argument("--no-env-yaml", action="store_true", help="ignore ./env.yaml")


# ---- list / config / validate / init -----------------------------------------------------------


def _bundled_info() -> list[dict[str, Any]]:
    from .catalog import bundled_dataset, bundled_servers, bundled_spec
    from .dataset import iter_rows
    from .registration import env_id

    info = []
    for name in sorted(bundled_servers()):
        spec = bundled_spec(name)
        tools: dict[str, None] = {}
        tasks = 0
        with contextlib.suppress(FileNotFoundError):
            for _, row, _ in iter_rows(bundled_dataset(name)):
                if row is None:
                    continue
                tasks += 1
                for tool in row["responses_create_params"].get("tools") or []:
                    if isinstance(tool, dict) and tool.get("name"):
                        tools[str(tool["name"])] = None
        info.append(
            {
                "name": name,
                "env_id": env_id(name),
                "tasks": tasks,
                "tools": list(tools),
                "domain": spec.config.get("domain"),
                "description": spec.config.get("description") or "",
            }
        )
    return info


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_list(args: argparse.Namespace) -> int:
    """Print the bundled servers: env ids, task counts, tools."""
    info = _bundled_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [["server", "env id", "tasks", "tools", "description"]]
    rows += [[i["name"], i["env_id"], str(i["tasks"]), ", ".join(i["tools"]), i["description"]] for i in info]
    print(_table(rows))
    print("\nAny other server: gym.make('NemoGym/Generic-v0', base_url=..., dataset=...) or config_paths=[...].")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print the merged config as YAML, secrets redacted."""
    import yaml

    from .head import public_config

    names, overrides = _split_targets(args.targets)
    cfg = _load(names, overrides, args)
    sys.stdout.write(yaml.safe_dump(public_config(cfg), sort_keys=False, allow_unicode=True))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check every row of each dataset; report offending lines; exit 1 if any."""
    from .dataset import iter_rows

    bad_total = 0
    for path in args.datasets:
        if not Path(path).is_file():
            raise CliError(f"dataset {path!r} not found")
        valid = bad = 0
        for number, _, problem in iter_rows(path):
            if problem is None:
                valid += 1
            else:
                bad += 1
                print(f"{path}:{number}: {problem}", file=sys.stderr)
        if valid == 0 and bad == 0:
            print(f"{path}:0: the dataset has no rows", file=sys.stderr)
            bad = 1
        bad_total += bad
        state = "ok" if bad == 0 else "INVALID"
        print(f"{path}: {valid} valid row(s), {bad} invalid: {state}")
    return 1 if bad_total else 0


def cmd_init(args: argparse.Namespace) -> int:
    """Scaffold a new resources server folder."""
    from .scaffold import init_server

    root = init_server(args.name, args.dir)
    files = sorted(str(p.relative_to(root.parent)) for p in root.rglob("*") if p.is_file())
    print(f"created {root}:")
    for f in files:
        print(f"  {f}")
    rel = os.path.relpath(root)
    name = args.name
    print(
        "\nnext:\n"
        f"  python -m pytest {rel}/tests -q\n"
        f"  {PROG} serve \"+config_paths=[{rel}/configs/{name}.yaml]\"\n"
        f"  {PROG} rollouts \"+config_paths=[{rel}/configs/{name}.yaml]\" --input {rel}/data/example.jsonl --policy openai"
    )
    return 0


# ---- serve -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise _Stop()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_serve(args: argparse.Namespace) -> int:
    """Start servers and the head server; run until Ctrl-C or SIGTERM."""
    from .config import server_specs
    from .head import HeadServer, head_address
    from .launch import Launcher, is_loopback

    names, overrides = _split_targets(args.targets)
    cfg = _load(names, overrides, args)
    specs = server_specs(cfg)
    if not specs:
        raise CliError(
            "nothing to serve: name bundled servers (see `nemo-gym-env list`) or pass \"+config_paths=[...]\""
        )
    for name, stype in _other_instances(cfg):
        _err(f"not starting {name!r} ({stype}): nemo-gym-env plays the agent and the model itself (`rollouts`)")
    host, port = head_address(cfg)
    if not is_loopback(host):
        _err(f"warning: the head server listens on {host}, reachable from the network (secrets stay redacted)")
    started = time.monotonic()
    with _sigterm_raises():
        launcher = head = None
        try:
            head = HeadServer(cfg, host=host, port=port)  # bind first: a taken port fails fast
            launcher = Launcher(stream_logs=True, auto_restart=True, log_dir=args.log_dir)
            head.processes = launcher.start_all(specs)
            head.start()
            elapsed = time.monotonic() - started
            width = max(len("head_server"), *(len(p.name) for p in head.processes))
            lines = [f"{PROG}: {len(head.processes)} server(s) ready in {elapsed:.2f} s"]
            lines += [f"  {p.name:<{width}}  {p.url}" for p in head.processes]
            lines.append(f"  {'head_server':<{width}}  {head.url}  (GET /servers, GET /global_config_dict_yaml)")
            lines.append(f"logs: {launcher.log_dir}" + ("" if args.log_dir else " (removed on exit)"))
            lines.append(f"rollouts against them: {PROG} rollouts --head-url {head.url} --policy ...")
            lines.append("Ctrl-C to stop.")
            print("\n".join(lines), flush=True)
            while True:
                time.sleep(3600)
        except (KeyboardInterrupt, _Stop):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # let the stopping finish (bounded: 5 s per server)
            print(f"{PROG}: stopping", file=sys.stderr, flush=True)
            return 0
        finally:
            if head is not None:
                head.stop()
            if launcher is not None:
                launcher.close()


# ---- rollouts ----------------------------------------------------------------------------------


@dataclass
class _Target:
    """One resources server of a rollouts run."""

    name: str
    url: str | None = None  # None: launched by this command
    spec: Any = None
    bundled: str | None = None  # the bundled server it is (scripted player, example data)
    rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


def _bundled_name(*candidates: str) -> str | None:
    from .catalog import bundled_servers

    bundled = bundled_servers()
    return next((c for c in candidates if c in bundled), None)


def _targets(args: argparse.Namespace, names: list[str], cfg: Any) -> dict[str, _Target]:
    from .config import server_specs
    from .head import fetch_servers

    if args.head_url:
        found = fetch_servers(args.head_url)
        if names:
            unknown = [n for n in names if n not in found]
            if unknown:
                raise CliError(f"the head server at {args.head_url} has no server {unknown[0]!r}; it has: {', '.join(found)}")
            found = {n: found[n] for n in names}
        if not found:
            raise CliError(f"the head server at {args.head_url} reports no servers")
        return {n: _Target(n, url=u, bundled=_bundled_name(n)) for n, u in found.items()}
    if args.server_url:
        if len(names) > 1:
            raise CliError("--server-url is one server; name at most one with --server")
        name = names[0] if names else "server"
        return {name: _Target(name, url=args.server_url.rstrip("/"), bundled=_bundled_name(name))}
    specs = server_specs(cfg)
    return {s.instance_name: _Target(s.instance_name, spec=s, bundled=_bundled_name(s.instance_name, s.impl_name)) for s in specs}


def _select_rows(
    args: argparse.Namespace, targets: dict[str, _Target], routes: dict[str, str]
) -> list[tuple[str, int, str]]:
    """Fill each target's rows (task index, row); return the problems (path, line, reason)."""
    from .catalog import bundled_dataset
    from .dataset import iter_rows
    from .metrics import TASK_INDEX_KEY
    from .rollouts import route_row

    problems: list[tuple[str, int, str]] = []

    def read(path: Path | str) -> Iterator[tuple[int, dict[str, Any]]]:
        if not Path(path).is_file():
            raise CliError(f"dataset {str(path)!r} not found")
        taken = 0
        for number, row, problem in iter_rows(path):
            if args.limit is not None and taken >= args.limit:
                return
            index = row.get(TASK_INDEX_KEY) if row is not None else None
            if problem is None and index is not None and (isinstance(index, bool) or not isinstance(index, int)):
                problem = f"{TASK_INDEX_KEY} must be an integer, got {index!r}"
            if problem is not None:
                problems.append((str(path), number, problem))
                continue
            taken += 1
            yield number, row

    if args.input:
        position = 0
        for number, row in read(args.input):
            try:
                target = targets[route_row(row, targets, routes)]
            except ValueError as exc:
                problems.append((args.input, number, f"{exc}; set it, or choose a server with --server"))
                continue
            target.rows.append((int(row.get(TASK_INDEX_KEY, position)), row))
            position += 1
        return problems
    offset = 0
    for target in targets.values():
        if target.bundled is None:
            raise CliError(f"server {target.name!r} has no bundled example data; pass --input tasks.jsonl")
        for number, row in read(bundled_dataset(target.bundled)):
            target.rows.append((int(row.get(TASK_INDEX_KEY, offset)), row))
            offset += 1
    return problems


def _has_scripted_player(server: str) -> bool:
    try:
        return importlib.util.find_spec(f"nemo_gym_env.servers.{server}.scripted") is not None
    except ImportError:
        return False


def _policy_kind(args: argparse.Namespace) -> str:
    if args.policy:
        return args.policy
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return "local"
    raise CliError(_INSTALL_LOCAL)


def _make_policy(kind: str, **kwargs: Any) -> Any:
    from .policies import make_policy

    return make_policy(kind, **{k: v for k, v in kwargs.items() if v is not None})


def _policies(kind: str, args: argparse.Namespace, cfg: Any, targets: dict[str, _Target]) -> dict[str, Any]:
    """One policy per target (the same object for all, except scripted players)."""
    if kind == "scripted":
        missing = [t.name for t in targets.values() if t.bundled is None]
        if missing:
            raise CliError(
                f"no scripted player for server {missing[0]!r}: the scripted policy plays only the bundled servers; "
                "use --policy openai or --policy local"
            )
        return {t.name: _make_policy("scripted", server=t.bundled) for t in targets.values()}
    if kind == "openai":
        base_url = args.base_url or _cfg_value(cfg, "policy_base_url")
        model = args.model or _cfg_value(cfg, "policy_model_name")
        api_key = args.api_key or _cfg_value(cfg, "policy_api_key")
        if not base_url or not model:
            raise CliError(
                "--policy openai needs an endpoint and a model: --base-url and --model, or policy_base_url and "
                "policy_model_name in env.yaml (with policy_api_key)"
            )
        policy = _make_policy(
            "openai", model=model, base_url=base_url, api_key=api_key, api=args.api, timeout_s=args.turn_timeout
        )
    else:
        _err(f"loading the local model {args.model or '(embedded SmolLM2-135M-Instruct)'} ...")
        policy = _make_policy("local", model_path=args.model, device=args.device, seed=args.seed)
        _err(f"loaded {policy.name} in {getattr(policy, 'load_seconds', 0.0):.1f} s")
    return {t.name: policy for t in targets.values()}


def _describe(policy: Any, kind: str, args: argparse.Namespace, cfg: Any) -> str:
    from .config import redact

    text = "scripted (each server's scripted player)" if kind == "scripted" else getattr(policy, "name", kind)
    if kind == "openai":
        text += f" at {args.base_url or _cfg_value(cfg, 'policy_base_url')}"
    return redact(text)


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {
        k: v
        for k, v in {"temperature": args.temperature, "top_p": args.top_p, "max_output_tokens": args.max_output_tokens}.items()
        if v is not None
    }


def _check_numbers(args: argparse.Namespace) -> None:
    for flag, value, low in (
        ("--num-repeats", args.num_repeats, 1),
        ("--concurrency", args.concurrency, 1),
        ("--limit", args.limit, 1),
        ("--max-steps", args.max_steps, 1),
        ("--max-output-tokens", args.max_output_tokens, 1),
    ):
        if value is not None and value < low:
            raise CliError(f"{flag} must be >= {low}, got {value}")
    for flag, value in (("--timeout", args.timeout), ("--turn-timeout", args.turn_timeout)):
        if value is not None and value <= 0:
            raise CliError(f"{flag} must be > 0, got {value}")
    if args.server_url and args.head_url:
        raise CliError("give --head-url or --server-url, not both")
    for flag, url in (("--server-url", args.server_url), ("--head-url", args.head_url), ("--base-url", args.base_url)):
        if url is not None and not url.startswith(("http://", "https://")):
            raise CliError(f"{flag} must be an http:// or https:// URL, got {url!r}")


async def _run(jobs: Iterator[Any], writer: Any, progress: Any, policies: list[Any], args: argparse.Namespace,
               stopped: list[int]) -> None:
    from .rollouts import collect_jobs

    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()

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
        rows = collect_jobs(jobs, concurrency=args.concurrency, max_steps=args.max_steps, turn_timeout_s=args.turn_timeout)
        async with contextlib.aclosing(rows):
            async for row in rows:
                writer.write(row)
                progress.update(row)
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
        for policy in {id(p): p for p in policies}.values():
            with contextlib.suppress(Exception):
                await policy.aclose()


@dataclass
class _Plan:
    """What a rollouts run will do, resolved and checked before anything starts."""

    cfg: Any
    kind: str
    targets: dict[str, _Target]
    policies: dict[str, Any] = field(default_factory=dict)


def _plan(args: argparse.Namespace) -> _Plan:
    """Servers, tasks and policy of a rollouts run; raises CliError on anything wrong."""
    _check_numbers(args)
    names, overrides = _split_targets(args.targets)
    names = list(dict.fromkeys([*names, *(args.server or [])]))
    launching = not (args.head_url or args.server_url)
    cfg = _load(names if launching else [], overrides, args)
    targets = _targets(args, names, cfg)
    kind = _policy_kind(args)
    if not targets:  # nothing named, nothing configured: every bundled server
        from .catalog import bundled_servers

        names = sorted(bundled_servers())
        if kind == "scripted":
            unplayable = [n for n in names if not _has_scripted_player(n)]
            if unplayable:
                _err(f"skipping {', '.join(unplayable)}: no scripted player (scripted.py)")
            names = [n for n in names if n not in unplayable]
        cfg = _load(names, overrides, args)
        targets = _targets(args, names, cfg)

    problems = _select_rows(args, targets, _agent_routes(cfg))
    for path, line, reason in problems:
        print(f"{path}:{line}: {reason}", file=sys.stderr)
    if problems:
        if args.strict:
            raise CliError(f"{len(problems)} invalid row(s); fix them (see `{PROG} validate`) or drop --strict")
        _err(f"skipping {len(problems)} invalid row(s); the valid ones run (--strict stops instead)")
    targets = {n: t for n, t in targets.items() if t.rows}
    if not targets:
        raise CliError("no valid task rows to run")
    plan = _Plan(cfg, kind, targets)
    plan.policies = _policies(kind, args, cfg, targets)
    return plan


def _collect(plan: _Plan, args: argparse.Namespace, writer: Any) -> list[int]:
    """Launch what is needed and run the missing rollouts into ``writer``; returns the stop signal, if any."""
    from .client import ResourcesClient
    from .launch import Launcher
    from .rollouts import Progress, RolloutJob, apply_sampling

    targets, repeats = plan.targets, args.num_repeats
    expected = sum(len(t.rows) for t in targets.values()) * repeats
    todo = {n: [(ti, row) for ti, row in t.rows if any((ti, r) not in writer.done for r in range(repeats))]
            for n, t in targets.items()}
    remaining = sum(1 for t in targets.values() for ti, _ in t.rows for r in range(repeats) if (ti, r) not in writer.done)
    stopped: list[int] = []
    launcher = None
    try:
        to_launch = [targets[n].spec for n, rows in todo.items() if rows and targets[n].url is None]
        if to_launch:
            started = time.monotonic()
            launcher = Launcher(auto_restart=True, stream_logs=args.debug, log_dir=args.log_dir)
            for proc in launcher.start_all(to_launch):
                targets[proc.name].url = proc.url
            _err(f"started {len(to_launch)} server(s) in {time.monotonic() - started:.1f} s")
        policy = _describe(next(iter(plan.policies.values())), plan.kind, args, plan.cfg)
        _err(f"{expected} rollout(s), {remaining} to run: {expected // repeats} task(s) x {repeats} on "
             f"{', '.join(targets)}; policy {policy}; output {writer.path}")
        if not remaining:
            return stopped
        sampling = _sampling(args)

        def jobs() -> Iterator[RolloutJob]:
            for n, rows in todo.items():
                client = ResourcesClient(targets[n].url, timeout_s=args.timeout, verify_timeout_s=args.timeout)
                for ti, row in rows:
                    prepared = apply_sampling(row, sampling)
                    for r in range(repeats):
                        if (ti, r) not in writer.done:
                            yield RolloutJob(prepared, ti, r, client, plan.policies[n], n)

        progress = Progress(expected, initial=expected - remaining)
        try:
            asyncio.run(_run(jobs(), writer, progress, list(plan.policies.values()), args, stopped))
        except asyncio.CancelledError:
            if not stopped:
                raise
        finally:
            progress.close()
    except KeyboardInterrupt:
        stopped.append(signal.SIGINT)
    except _Stop:
        stopped.append(signal.SIGTERM)
    finally:
        if launcher is not None:
            launcher.close()
    return stopped


def _report(output: Path) -> int:
    """Metrics of the whole output file: the table on stdout, ``<stem>_metrics.json`` beside it."""
    from .rollouts import failures_path, metrics_path, metrics_table, summarize

    summary = summarize(output)
    metrics_file = metrics_path(output)
    metrics_file.write_text(json.dumps(summary, indent=2) + "\n")
    print(metrics_table(summary))
    print(f"\nrollouts: {output} ({summary['num_rollouts']} rows)\nmetrics:  {metrics_file}")
    if summary["num_failed"]:
        print(f"failures: {failures_path(output)}")
        _err(f"{summary['num_failed']} rollout(s) failed (reasons in {failures_path(output)}); --resume retries them")
        return 1
    return 0


def cmd_rollouts(args: argparse.Namespace) -> int:
    """Collect rollouts: tasks x repeats through a policy against resources servers."""
    from .rollouts import RolloutWriter

    plan = _plan(args)
    output = Path(args.output)
    secrets = [s for s in (args.api_key, _cfg_value(plan.cfg, "policy_api_key")) if s]
    if not args.resume and output.is_file() and output.stat().st_size:
        _err(f"starting {output} over (it had rows; --resume continues a run instead)")
    with _sigterm_raises(), RolloutWriter(output, resume=args.resume, secrets=secrets) as writer:
        if writer.torn_bytes:
            _err(f"dropped a torn last line ({writer.torn_bytes} bytes) of {output} left by an interrupted run")
        if args.resume:
            _err(f"resuming {output}: {writer.resumed_rows} row(s) already there")
        stopped = _collect(plan, args, writer)
    if stopped:
        _err(f"interrupted: {output} holds every finished rollout; rerun with --resume to finish")
        return 128 + int(stopped[0])
    return _report(output)


# ---- view / play (nemo_gym_env.viewer) ---------------------------------------------------------


def _viewer_secrets(args: argparse.Namespace) -> list[str]:
    from .viewer.run import env_yaml_secrets

    return env_yaml_secrets(_env_yaml(args), required=bool(getattr(args, "env_yaml", None)))


def _add_listen(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default 0: a free one)")


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the rollout viewer over rollout files until Ctrl-C."""
    from .viewer import run_view

    if args.max_row_mb <= 0:
        raise CliError(f"--max-row-mb must be > 0, got {args.max_row_mb}")
    return run_view(args.paths or [DEFAULT_OUTPUT], host=args.host, port=args.port, secrets=_viewer_secrets(args),
                    max_row_bytes=int(args.max_row_mb * 2**20))


def cmd_play(args: argparse.Namespace) -> int:
    """Serve a page to play one environment by hand until Ctrl-C."""
    from .config import parse_overrides
    from .registration import GENERIC_ID, env_id
    from .viewer import EnvSpec, run_play

    names, overrides = _split_targets(args.targets)
    config_paths, others = parse_overrides(overrides)
    if others:
        raise CliError(f"play takes a server name, \"+config_paths=[...]\" or --server-url, not {others[0]!r}")
    if len(names) > 1 or (args.server_url and config_paths):
        raise CliError("play one server: a bundled NAME, \"+config_paths=[...]\" (NAME picks an instance) or --server-url")
    if args.max_steps < 1:
        raise CliError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.server_url and not args.server_url.startswith(("http://", "https://")):
        raise CliError(f"--server-url must be an http:// or https:// URL, got {args.server_url!r}")
    kwargs: dict[str, Any] = {"max_steps": args.max_steps}
    if args.input:
        if not Path(args.input).is_file():
            raise CliError(f"dataset {args.input!r} not found")
        kwargs["dataset"] = args.input
    if args.server_url or config_paths:
        if not args.input:
            raise CliError("--server-url and \"+config_paths=[...]\" need the tasks: --input tasks.jsonl")
        if args.server_url:
            kwargs["base_url"] = args.server_url
        else:
            kwargs["config_paths"] = config_paths
        if names:
            kwargs["server"] = names[0]
        spec = EnvSpec(GENERIC_ID, kwargs)
    elif names:
        _bundled_yaml(names[0])  # an unknown name fails here, listing the bundled ones
        spec = EnvSpec(env_id(names[0]), kwargs)
    else:
        raise CliError("name a server to play: a bundled NAME (see `nemo-gym-env list`), \"+config_paths=[...]\" "
                       "or --server-url URL --input tasks.jsonl")
    return run_play(spec, host=args.host, port=args.port, output=args.output, secrets=_viewer_secrets(args))


# ---- the parser --------------------------------------------------------------------------------


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=100)


def build_parser() -> argparse.ArgumentParser:
    """The ``nemo-gym-env`` argument parser."""
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks and debug logs")
    parser = _Parser(
        prog=PROG,
        parents=[common],
        description="NeMo-Gym-style resources servers: serve them, collect rollouts, scaffold and check.",
        epilog=f"`{PROG} rollouts` with no arguments: every bundled server's example tasks with the local model.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "serve",
        parents=[common],
        help="start servers and a head server (like ng_run)",
        description=_wrap("Start resources servers standalone, plus a head server (default 127.0.0.1:11000; "
        "+head_server.port=0 for a free port) serving GET /servers and GET /global_config_dict_yaml "
        "(secrets redacted). Ctrl-C or SIGTERM stops everything."),
        epilog=f'examples:\n  {PROG} serve example_multi_step\n  {PROG} serve "+config_paths=[a.yaml,b.yaml]" '
        "+head_server.port=0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    p.add_argument("--log-dir", metavar="DIR", help="keep server logs here (default: a temporary folder)")
    _add_env_yaml(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "rollouts",
        parents=[common],
        help="collect rollouts (like ng_collect_rollouts)",
        description=_wrap("Run each task of a JSONL dataset through a policy against resources servers and write one "
        "row per rollout (NeMo Gym's format: the /verify reply plus _ng_task_index and _ng_rollout_index). "
        "Servers are launched by the command (bundled NAMEs, +config_paths=[...], or every bundled server when "
        "none is named) or already running (--head-url, --server-url)."),
        epilog=f"examples:\n  {PROG} rollouts\n  {PROG} rollouts --policy openai            # endpoint from env.yaml\n"
        f"  {PROG} rollouts example_multi_step --policy scripted --num-repeats 4\n"
        f"  {PROG} rollouts --head-url http://127.0.0.1:11000 --input tasks.jsonl --policy openai --resume",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    where = p.add_argument_group("servers and data")
    where.add_argument("--server", action="append", metavar="NAME", help="a server to use (repeatable); its example data by default")
    where.add_argument("--head-url", metavar="URL", help="use the servers of a running head server (GET /servers)")
    where.add_argument("--server-url", metavar="URL", help="use one running resources server")
    where.add_argument("--input", "-i", metavar="PATH", help="tasks JSONL (NeMo Gym rows); default: the servers' example data")
    where.add_argument("--output", "-o", metavar="PATH", default=DEFAULT_OUTPUT, help=f"output JSONL (default {DEFAULT_OUTPUT})")
    where.add_argument("--limit", type=int, metavar="N", help="only the first N valid tasks of each dataset")
    where.add_argument("--strict", action="store_true", help="stop on an invalid row instead of skipping it")
    where.add_argument("--log-dir", metavar="DIR", help="keep the logs of launched servers here")
    _add_env_yaml(where)
    pol = p.add_argument_group("policy")
    pol.add_argument("--policy", choices=POLICY_KINDS, help="default: local when torch is installed")
    pol.add_argument("--model", metavar="NAME", help="model name (openai) or path/id (local); env.yaml: policy_model_name")
    pol.add_argument("--base-url", metavar="URL", help="OpenAI-compatible endpoint; env.yaml: policy_base_url")
    pol.add_argument("--api-key", metavar="KEY", help="API key; env.yaml: policy_api_key (safer than the command line)")
    pol.add_argument("--api", choices=("responses", "chat"), default="responses",
                     help="openai: the Responses API (default) or Chat Completions")
    pol.add_argument("--device", metavar="DEV", help="local: cpu (default), cuda or cuda:N")
    pol.add_argument("--seed", type=int, help="local: makes sampling reproducible")
    pol.add_argument("--temperature", type=float, help="override responses_create_params.temperature")
    pol.add_argument("--top-p", type=float, help="override responses_create_params.top_p")
    pol.add_argument("--max-output-tokens", type=int, metavar="N", help="override responses_create_params.max_output_tokens")
    run = p.add_argument_group("run")
    run.add_argument("--num-repeats", type=int, default=1, metavar="N", help="rollouts per task (default 1)")
    run.add_argument("--concurrency", type=int, default=8, metavar="N", help="rollouts in flight (default 8)")
    run.add_argument("--max-steps", type=int, default=16, metavar="N", help="model turns per episode (default 16)")
    run.add_argument("--timeout", type=float, default=120.0, metavar="S", help="server request timeout (default 120 s)")
    run.add_argument("--turn-timeout", type=float, metavar="S", help="policy turn timeout (default: the policy's)")
    run.add_argument("--resume", action="store_true", help="continue the output file: skip rollouts already in it")
    p.set_defaults(func=cmd_rollouts)

    p = sub.add_parser(
        "view",
        parents=[common],
        help="open rollout files in a local web page",
        description=_wrap("Serve a local page over rollout JSONL files (and their _failures.jsonl sidecars): the "
        "list (filter, sort), each rollout's conversation, tool calls and verify reply, a task's rollouts side by "
        "side, and the summary that `rollouts` prints. Files still being written are followed. Binds 127.0.0.1."),
        epilog=f"examples:\n  {PROG} view\n  {PROG} view results/rollouts.jsonl other/rollouts.jsonl --port 8080",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help=f"rollout files (default {DEFAULT_OUTPUT})")
    _add_listen(p)
    p.add_argument("--max-row-mb", type=float, default=16.0, metavar="MB",
                   help="longest line read as a row (default 16); longer ones are listed as errors")
    _add_env_yaml(p)
    p.set_defaults(func=cmd_view)

    p = sub.add_parser(
        "play",
        parents=[common],
        help="play an environment by hand in a local web page",
        description=_wrap("Serve a local page where a person plays one episode at a time through the same "
        "NemoGymEnv a policy uses: the task's messages, a form per tool, each output, a final answer, then the "
        "reward and the verify reply. A finished episode can be saved as a rollout row. Binds 127.0.0.1."),
        epilog=f"examples:\n  {PROG} play example_multi_step\n"
        f'  {PROG} play "+config_paths=[my_env/configs/my_env.yaml]" --input my_env/data/example.jsonl\n'
        f"  {PROG} play --server-url http://127.0.0.1:8000 --input tasks.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="NAME|+config_paths=[...]", help="a bundled server or a config")
    p.add_argument("--server-url", metavar="URL", help="play a running resources server (with --input)")
    p.add_argument("--input", "-i", metavar="PATH", help="tasks JSONL (default: a bundled server's example data)")
    p.add_argument("--output", "-o", metavar="PATH", default="results/played.jsonl",
                   help="where saved episodes go (default results/played.jsonl)")
    _add_listen(p)
    p.add_argument("--max-steps", type=int, default=64, metavar="N", help="turns before the episode is verified anyway (default 64)")
    _add_env_yaml(p)
    p.set_defaults(func=cmd_play)

    p = sub.add_parser("list", parents=[common], help="the bundled servers, env ids and tools",
                       description="List the bundled servers: env ids, example tasks, tools.")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "config",
        parents=[common],
        help="print the merged config (secrets redacted)",
        description=_wrap("Print the merged, resolved config as YAML with every secret redacted."),
        epilog=f'examples:\n  {PROG} config example_multi_step\n  {PROG} config "+config_paths=[a.yaml]" +key=value',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    _add_env_yaml(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("validate", parents=[common], help="check dataset rows",
                       description="Check every row of JSONL datasets; report offending lines; exit 1 if any.")
    p.add_argument("datasets", nargs="+", metavar="DATASET", help="JSONL files")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("init", parents=[common], help="scaffold a new resources server",
                       description="Create NAME/ with app.py, configs/NAME.yaml, data/example.jsonl (5 rows), "
                       "tests/test_app.py and README.md.")
    p.add_argument("name", metavar="NAME", help="server name (a Python identifier)")
    p.add_argument("--dir", default=".", metavar="PATH", help="where to create NAME/ (default: here)")
    p.set_defaults(func=cmd_init)
    return parser


def _expected_errors() -> tuple[type[BaseException], ...]:
    from .catalog import UnknownServerError
    from .config import ConfigError
    from .dataset import DatasetError
    from .head import LaunchError
    from .policies.models import ModelProvisionError
    from .rollouts import RolloutFileError
    from .scaffold import ScaffoldError

    return (CliError, ConfigError, LaunchError, UnknownServerError, DatasetError, RolloutFileError, ScaffoldError,
            ModelProvisionError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    # argparse fills a nargs="*" positional once, so names and +key=value overrides written
    # after an option come back as leftovers: they belong to the command's targets.
    args, leftovers = parser.parse_known_args(argv)
    if leftovers:
        if hasattr(args, "targets") and not any(item.startswith("-") for item in leftovers):
            args.targets = [*(args.targets or []), *leftovers]
        else:
            parser.error(f"unrecognized arguments: {' '.join(leftovers)}")
    debug = bool(getattr(args, "debug", False))
    args.debug = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING, format=f"{PROG}: %(levelname)s %(name)s: %(message)s"
    )
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - every error becomes one line (tracebacks with --debug)
        if debug:
            traceback.print_exc()
        message = str(exc) or type(exc).__name__
        if not isinstance(exc, _expected_errors()):
            message = f"{type(exc).__name__}: {message}"
        first, _, rest = message.partition("\n")
        _err(f"error: {first}")
        if rest:  # e.g. a crashed server's last log lines
            print("\n".join(f"  | {line}" for line in rest.splitlines()), file=sys.stderr)
        if not debug and not isinstance(exc, _expected_errors()):
            _err("(run with --debug for the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
