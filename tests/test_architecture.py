"""The shape of the package (docs/architecture.md): imports only along the layer table the page
holds, no import cycles between modules or packages, no private names across modules, modules of a
readable size."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = {"nemo_gym_env": REPO / "nemo_gym_env", "nemo_gym_env.servers": REPO / "servers",
            "nemo_gym_env.adapters": REPO / "adapters"}

MAX_LINES = 600
ONE_CONCEPT = {
    # A table of verifiable instructions, one class per instruction: long, and one concept.
    "nemo_gym_env.servers.instruction_following.instructions",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "tests" in parts or "__pycache__" in parts:
                continue
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES.get(module, Path()).name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _all_imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """``(imported module, names, line)`` of every import in a module, deferred and type-only ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.append((_resolve(module, node), [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names)
    return found


EVERYWHERE = {"errors", "imports"}
"""Modules every package may import (standard library only, see docs/architecture.md)."""


def _package(module: str) -> str | None:
    """The row of the layer table a module of ours belongs to (None: not ours)."""
    parts = module.split(".")
    if parts[0] != "nemo_gym_env":
        return None
    if len(parts) == 1:
        return "nemo_gym_env"
    return parts[1]


def _layer_table() -> dict[str, set[str]]:
    """``{package: packages it may import}`` from the marked table of docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text()
    match = re.search(r"<!-- layers:[^>]*-->\n(.*?)<!-- /layers -->", text, re.S)
    assert match, "docs/architecture.md lost its layer table (between <!-- layers --> markers)"
    table = {}
    for line in match.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        package = cells[0].strip("`")
        table[package] = set(re.findall(r"`([a-z_]+)`", cells[1]))
    return table


LAYERS = _layer_table()


def test_the_layer_table_is_one_way() -> None:
    order: list[str] = []
    state: dict[str, int] = {}

    def walk(node: str) -> None:
        assert state.get(node) != 1, f"the layer table of docs/architecture.md has a circle through {node}"
        if node in state:
            return
        state[node] = 1
        for nxt in sorted(LAYERS.get(node, ())):
            assert nxt in LAYERS, f"docs/architecture.md: `{node}` may import `{nxt}`, which has no row"
            walk(nxt)
        state[node] = 2
        order.append(node)

    for package in LAYERS:
        walk(package)


def test_every_package_has_a_row_in_the_layer_table() -> None:
    packages = {_package(m) for m in MODULES} - EVERYWHERE - {None}
    missing = sorted(p for p in packages if p not in LAYERS)
    assert not missing, (f"packages with no row in the layer table of docs/architecture.md: {missing}; add one "
                         "saying which packages each may import")


def _layer_offences(modules: dict[str, Path], layers: dict[str, set[str]]) -> list[str]:
    """One line per import of ``modules`` that the layer table ``layers`` does not allow."""
    offences = []
    for module, path in modules.items():
        source = _package(module)
        if source in EVERYWHERE or source not in layers:
            continue
        allowed = layers[source] | EVERYWHERE | {source}
        for target, _, line in _all_imports(module, path):
            imported = _package(target)
            if imported is not None and imported not in allowed:
                rule = ", ".join(sorted(layers[source])) or "nothing else"
                offences.append(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}: imports "
                                f"{target}, but `{source}` may import only {rule} (docs/architecture.md, the layer table)")
    return offences


def test_imports_follow_the_layer_table() -> None:
    offences = _layer_offences(MODULES, LAYERS)
    assert not offences, "wrong-way imports:\n" + "\n".join(offences)


def test_a_wrong_way_import_is_named_with_its_file_and_rule(tmp_path: Path) -> None:
    wrong = tmp_path / "head.py"
    wrong.write_text("import json\n\ndef f():\n    from nemo_gym_env.launch.config import load_config\n")
    offences = _layer_offences({"nemo_gym_env.client.head_client": wrong}, LAYERS)
    assert offences == [f"{wrong}:4: imports nemo_gym_env.launch.config, but `client` may import only protocol, "
                        "system (docs/architecture.md, the layer table)"]


def test_no_circle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        source = _package(module)
        for target, _, _ in _all_imports(module, path):
            imported = _package(target)
            if imported not in (None, source, "nemo_gym_env") and source != "nemo_gym_env":
                graph.setdefault(source, set()).add(imported)
    state: dict[str, int] = {}
    circles = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                walk(nxt, [*stack, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [])
    assert not circles, "circles between packages:\n" + "\n".join(circles)


def _top_level_imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """``(imported module, names, line)`` of the imports a module runs when it is imported."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue  # type-only: never runs
            if isinstance(node, ast.ImportFrom):
                target = _resolve(module, node)
                found.append((target, [a.name for a in node.names], node.lineno))
            elif isinstance(node, ast.Import):
                found.extend((a.name, [], node.lineno) for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges = set()
        for target, names, _ in _top_level_imports(module, path):
            for candidate in [f"{target}.{n}" for n in names] + [target]:
                if candidate in MODULES and candidate != module:
                    edges.add(candidate)
                    break
        graph[module] = edges
    return graph


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_name_is_imported_from_another_module() -> None:
    offences = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(module, node)
                if not target.startswith("nemo_gym_env"):
                    continue
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private or any(part.startswith("_") and not part.startswith("__") for part in target.split(".")):
                    offences.append(f"{path.relative_to(REPO)}:{node.lineno}: from {target} import {private}")
    assert not offences, "\n".join(offences)


def test_modules_are_a_readable_size() -> None:
    long = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    too_long = {m: n for m, n in long.items() if n > MAX_LINES and m not in ONE_CONCEPT}
    assert not too_long, f"modules over {MAX_LINES} lines (split them by concept): {too_long}"


BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException)}


def test_every_public_error_has_the_common_base() -> None:
    errors = importlib.import_module("nemo_gym_env.errors")
    for name in errors.__all__:
        if name == "Stopped":  # a request to stop (SIGTERM), not an error: a KeyboardInterrupt, as Ctrl-C is
            assert issubclass(errors.Stopped, KeyboardInterrupt) and not issubclass(errors.Stopped, Exception)
            continue
        assert issubclass(getattr(errors, name), errors.NemoGymError), name
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id in BUILTIN_EXCEPTIONS for b in node.bases) and not node.name.startswith("_"):
                assert module.startswith("nemo_gym_env.servers") or module == "nemo_gym_env.errors", (
                    f"{module}.{node.name}: public errors live in nemo_gym_env.errors")


DOCUMENTED = [
    ("nemo_gym_env.server", ["BaseResourcesServerConfig", "SimpleResourcesServer", "SESSION_ID_KEY",
                             "BaseRunRequest", "BaseVerifyRequest", "BaseVerifyResponse"]),
    ("nemo_gym_env.protocol.types", ["BaseRunRequest", "BaseVerifyRequest", "BaseVerifyResponse",
                                     "make_response", "FunctionCallOutput", "Response"]),
    ("nemo_gym_env.launch", ["Launcher", "LaunchError"]),
    ("nemo_gym_env.launch.config", ["load_config", "server_specs"]),
    ("nemo_gym_env.launch.catalog", ["bundled_dataset", "bundled_spec", "bundled_servers"]),
    ("nemo_gym_env.protocol.dataset", ["load_rows", "iter_rows"]),
    ("nemo_gym_env.protocol.scripting", ["assistant_message", "field", "function_call", "turn_of", "CALL_ID"]),
    ("nemo_gym_env.policies", ["scripted_player", "ScriptedPolicy", "make_policy", "LocalPolicy", "OpenAIPolicy"]),
    ("nemo_gym_env.envs.vector", ["NemoGymVectorEnv"]),
    ("nemo_gym_env.envs.env", ["NemoGymEnv"]),
    ("nemo_gym_env.server.workers", ["ProcessPoolRunner", "RayRunner", "TaskTimeout"]),
    ("nemo_gym_env.rollouts", ["collect", "RolloutWriter"]),
    ("nemo_gym_env.launch.head_server", ["HeadServer", "public_config"]),
    ("nemo_gym_env.client", ["fetch_global_config", "fetch_servers"]),
    ("nemo_gym_env.protocol.parser", ["render_tool_call", "parse_model_text"]),
    ("nemo_gym_env.client.loop", ["background_loop"]),
    ("nemo_gym_env.envs.actions", ["normalize_action"]),
    ("nemo_gym_env.ray_cluster", ["RayVectorEnv", "ray_collect", "RayLauncher"]),
    ("nemo_gym_env.policies.models", ["DEFAULT_MODEL_NAME", "default_model_dir"]),
    ("nemo_gym_env", ["NemoGymEnv", "NemoGymVectorEnv", "ActionError", "ServerError", "GENERIC_ID", "env_id"]),
]


@pytest.mark.parametrize(("module", "names"), DOCUMENTED, ids=[m for m, _ in DOCUMENTED])
def test_documented_names_keep_working(module: str, names: list[str]) -> None:
    imported = importlib.import_module(module)
    for name in names:
        assert getattr(imported, name) is not None, f"{module}.{name}"
