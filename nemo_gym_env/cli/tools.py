"""The small commands: ``list``, ``config``, ``validate``, ``init``."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from nemo_gym_env.cli.common import PROG, add_env_yaml, describe, env_yaml_path, split_targets
from nemo_gym_env.envs.registration import env_id
from nemo_gym_env.envs.sources import ServerSet
from nemo_gym_env.errors import UsageError
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers, bundled_spec
from nemo_gym_env.launch.head_server import public_config
from nemo_gym_env.protocol.dataset import iter_rows
from nemo_gym_env.rollouts.report import text_table
from nemo_gym_env.server.scaffold import init_server

__all__ = ["cmd_config", "cmd_init", "cmd_list", "cmd_validate", "config_arguments", "init_arguments", "list_arguments",
           "validate_arguments"]


def list_arguments(p: argparse.ArgumentParser) -> None:
    """``list``'s arguments."""
    describe(p, "List the bundled servers: env ids, example tasks, tools.")
    p.add_argument("--json", action="store_true", help="JSON instead of a table")


def config_arguments(p: argparse.ArgumentParser) -> None:
    """``config``'s arguments."""
    describe(p, "Print the merged, resolved config as YAML with every secret redacted.",
             "config example_multi_step", 'config "+config_paths=[a.yaml]" +key=value')
    p.add_argument("targets", nargs="*", metavar="NAME|+key=value", help="bundled server names and Hydra overrides")
    add_env_yaml(p)


def validate_arguments(p: argparse.ArgumentParser) -> None:
    """``validate``'s arguments."""
    describe(p, "Check every row of JSONL datasets; report offending lines; exit 1 if any.")
    p.add_argument("datasets", nargs="+", metavar="DATASET", help="JSONL files")


def init_arguments(p: argparse.ArgumentParser) -> None:
    """``init``'s arguments."""
    describe(p, "Create NAME/ with app.py, configs/NAME.yaml, data/example.jsonl (5 rows), tests/test_app.py and "
             "README.md.")
    p.add_argument("name", metavar="NAME", help="server name (a Python identifier)")
    p.add_argument("--dir", default=".", metavar="PATH", help="where to create NAME/ (default: here)")


def _bundled_info() -> list[dict[str, Any]]:
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


def cmd_list(args: argparse.Namespace) -> int:
    """Print the bundled servers: env ids, task counts, tools."""
    info = _bundled_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [["server", "env id", "tasks", "tools", "description"]]
    rows += [[i["name"], i["env_id"], str(i["tasks"]), ", ".join(i["tools"]), i["description"]] for i in info]
    print(text_table(rows))
    print("\nAny other server: gym.make('NemoGym/Generic-v0', base_url=..., dataset=...) or config_paths=[...].")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print the merged config as YAML, secrets redacted."""
    names, overrides = split_targets(args.targets)
    cfg = ServerSet.launching(names, overrides, env_yaml=env_yaml_path(args)).cfg
    sys.stdout.write(yaml.safe_dump(public_config(cfg), sort_keys=False, allow_unicode=True))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check every row of each dataset; report offending lines; exit 1 if any."""
    bad_total = 0
    for path in args.datasets:
        if not Path(path).is_file():
            raise UsageError(f"dataset {path!r} not found")
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
    root = init_server(args.name, args.dir)
    files = sorted(str(p.relative_to(root.parent)) for p in root.rglob("*") if p.is_file())
    print(f"created {root}:")
    for f in files:
        print(f"  {f}")
    rel = os.path.relpath(root)
    folder = rel if os.sep in rel or rel.startswith(".") else f".{os.sep}{rel}"  # a path, never a bundled name
    test = f"python -m pytest {rel}/tests -q"
    if importlib.util.find_spec("pytest") is None:  # not part of the package's own install
        test = f"python -m pip install pytest && {test}"
    print(
        "\nnext:\n"
        f"  {test}\n"
        f"  {PROG} serve {folder}\n"
        f"  {PROG} rollouts {folder} --policy local    # offline: the embedded model (the `local` extra)\n"
        f"  {PROG} rollouts {folder} --policy openai   # your endpoint (env.yaml)"
    )
    return 0
