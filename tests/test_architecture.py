"""The shape of the package (docs/architecture.md): no import cycles, no private names across
modules, modules of a readable size, and old import paths that still work."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from nemo_gym_env.imports import MOVED

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


def test_every_public_error_has_the_common_base() -> None:
    errors = importlib.import_module("nemo_gym_env.errors")
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.NemoGymError), name
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id in ("Exception", "ValueError", "RuntimeError", "KeyError")
                    for b in node.bases) and not node.name.startswith("_"):
                assert module.startswith("nemo_gym_env.servers") or module == "nemo_gym_env.errors", (
                    f"{module}.{node.name}: public errors live in nemo_gym_env.errors")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_moved_modules_import_under_their_old_names(old: str) -> None:
    moved = importlib.import_module(old)
    assert moved is importlib.import_module(MOVED[old])
    assert moved.__spec__.name == MOVED[old]  # its own spec, not the alias's


DOCUMENTED = [
    ("nemo_gym_env.server", ["BaseResourcesServerConfig", "SimpleResourcesServer", "SESSION_ID_KEY",
                             "BaseRunRequest", "BaseVerifyRequest", "BaseVerifyResponse"]),
    ("nemo_gym_env.types", ["BaseRunRequest", "BaseVerifyRequest", "BaseVerifyResponse", "make_response",
                            "FunctionCallOutput", "Response"]),
    ("nemo_gym_env.launch", ["Launcher", "LaunchError"]),
    ("nemo_gym_env.config", ["load_config", "server_specs"]),
    ("nemo_gym_env.catalog", ["bundled_dataset", "bundled_spec", "bundled_servers"]),
    ("nemo_gym_env.dataset", ["load_rows", "iter_rows"]),
    ("nemo_gym_env.scripting", ["assistant_message", "field", "function_call", "turn_of", "CALL_ID"]),
    ("nemo_gym_env.policies", ["scripted_player", "ScriptedPolicy", "make_policy", "LocalPolicy", "OpenAIPolicy"]),
    ("nemo_gym_env.vector", ["NemoGymVectorEnv"]),
    ("nemo_gym_env.env", ["NemoGymEnv"]),
    ("nemo_gym_env.workers", ["ProcessPoolRunner", "RayRunner", "TaskTimeout"]),
    ("nemo_gym_env.rollouts", ["collect", "RolloutWriter"]),
    ("nemo_gym_env.head", ["HeadServer", "fetch_global_config", "fetch_servers"]),
    ("nemo_gym_env.parser", ["render_tool_call", "parse_model_text"]),
    ("nemo_gym_env.loop", ["background_loop"]),
    ("nemo_gym_env.actions", ["normalize_action"]),
    ("nemo_gym_env.ray_cluster", ["RayVectorEnv", "ray_collect", "RayLauncher"]),
    ("nemo_gym_env.policies.models", ["DEFAULT_MODEL_NAME", "default_model_dir"]),
    ("nemo_gym_env", ["NemoGymEnv", "NemoGymVectorEnv", "ActionError", "ServerError", "GENERIC_ID", "env_id"]),
]


@pytest.mark.parametrize(("module", "names"), DOCUMENTED, ids=[m for m, _ in DOCUMENTED])
def test_documented_names_keep_working(module: str, names: list[str]) -> None:
    imported = importlib.import_module(module)
    for name in names:
        assert getattr(imported, name) is not None, f"{module}.{name}"
