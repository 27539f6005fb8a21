"""Every ```python block of README.md and docs/**/*.md is code a user can copy as it stands.

Each block (test id ``FILE:LINE``, the line of its opening fence):

- parses (``ast``);
- defines every name it loads: assigned, imported, a ``def`` or ``class``, a ``for``, ``with ... as``,
  ``except ... as`` or walrus target, a ``global`` a function assigns, or a builtin (``__file__`` too).
  Scopes are Python's own, read with ``symtable``: a class body's names are not seen by its methods
  or comprehensions, a comprehension's variable does not leak, a walrus binds in the enclosing function;
- imports nothing with ``*``, and only modules that exist: installed here (the test environment has
  every extra) or a file of the same multi-file example; a name imported from ``nemo_gym_env`` exists there.

Markers, an HTML comment on the line just before the fence:

- ``<!-- continues: above -->``: the block goes on from the nearest ```python block above it in the
  same file (which may continue another) and may use the names that block defines at module level.
  Only for a block that cannot stand alone; a standalone block is better, and none uses it today.
- ``<!-- file: PATH -->``, or a first line ``# file: PATH``: the block is file PATH of a multi-file example
  (``docs/bring_your_env.md``, ``docs/mcp.md``); it may import the page's other files.

Running the blocks is other tests' job: ``tests/test_readme_snippets.py`` (the README),
``tests/bridge/test_docs.py``, ``tests/server/test_mcp_docs.py``, ``tests/ray_cluster/test_scale_out_doc.py``
and the porting example below.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import re
import subprocess
import symtable
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
FILE_MARKER = re.compile(r"<!-- file: (?P<path>\S+) -->|^# file: (?P<line>\S+)$")
CONTINUES = "<!-- continues: above -->"
KNOWN = set(dir(builtins)) | {"__file__"}


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    source: str
    marker: str  # the line before the fence, stripped
    previous: Block | None  # the ```python block above it in the same file

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    @property
    def file(self) -> str | None:
        """The path of this block in its multi-file example, if it is one."""
        first = self.source.split("\n", 1)[0]
        found = FILE_MARKER.search(self.marker) or FILE_MARKER.match(first)
        return found and (found["path"] or found["line"])


def python_blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.fullmatch(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
        if opening["lang"] == "python":
            body = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
            marker = lines[i - 1].strip() if i else ""
            found.append(Block(doc, i + 1, body, marker, found[-1] if found else None))
        i = end + 1
    return found


ALL = [block for doc in DOCS for block in python_blocks(doc)]


# ---- the checks -------------------------------------------------------------------------------


def _tables(table: symtable.SymbolTable):
    yield table
    for child in table.get_children():
        yield from _tables(child)


def defined_names(source: str) -> set[str]:
    """The module-level names a block binds (its own, and the ``global`` names its functions assign)."""
    top = symtable.symtable(source, "<block>", "exec")
    names = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    for table in _tables(top):
        names |= {s.get_name() for s in table.get_symbols() if s.is_declared_global() and s.is_assigned()}
    return names


def undefined_names(source: str, given: frozenset[str] = frozenset()) -> list[str]:
    """Names ``source`` loads from the module level (or builtins) that neither it nor ``given`` defines.

    Raises:
        SyntaxError: It does not parse.
        ValueError: A star import (which hides what it defines).
    """
    tree = ast.parse(source)
    stars = [node.module for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names)]
    if stars:
        raise ValueError(f"star import from {stars[0]}: import the names it uses")
    known = defined_names(source) | given | KNOWN
    missing = set()
    for table in _tables(symtable.symtable(source, "<block>", "exec")):
        for symbol in table.get_symbols():
            at_module = table.get_type() == "module" or symbol.is_global()
            if symbol.is_referenced() and at_module and symbol.get_name() not in known:
                missing.add(symbol.get_name())
    return sorted(missing)


def given_by_above(block: Block) -> frozenset[str]:
    """What the blocks this one continues define (``<!-- continues: above -->``, chained)."""
    names: set[str] = set()
    while block.marker == CONTINUES:
        assert block.previous is not None, f"{block.id}: {CONTINUES} with no python block above it"
        block = block.previous
        names |= defined_names(block.source)
    return frozenset(names)


def imports(source: str) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each import; ``names`` empty for ``import module``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def sibling_modules(doc: Path) -> set[str]:
    """The top-level module names of a page's multi-file examples (``clock/app.py``: ``clock``)."""
    return {Path(block.file).parts[0].removesuffix(".py") for block in python_blocks(doc) if block.file}


def import_problems(block: Block) -> list[str]:
    problems = []
    siblings = sibling_modules(block.doc)
    for module, names in imports(block.source):
        top = module.split(".")[0]
        if top in siblings:
            continue
        if importlib.util.find_spec(top) is None:
            problems.append(f"no module {top!r} (not installed, not a file of this example)")
            continue
        if top != "nemo_gym_env":
            continue
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            problems.append(f"import {module}: {exc}")
            continue
        for name in names:
            if name not in dir(loaded) and importlib.util.find_spec(f"{module}.{name}") is None:
                problems.append(f"{module} has no {name!r}")
    return problems


# ---- the tests --------------------------------------------------------------------------------


def test_the_pages_have_their_blocks():
    assert len(ALL) >= 30 and {block.doc.name for block in ALL} >= {"README.md", "scale_out.md", "porting.md"}
    assert not [block.id for block in ALL if block.marker == CONTINUES]  # none needed: keep it that way if you can


@pytest.mark.parametrize("block", ALL, ids=lambda block: block.id)
def test_the_block_parses_and_defines_every_name_it_uses(block: Block):
    try:
        missing = undefined_names(block.source, given_by_above(block))
    except SyntaxError as exc:
        pytest.fail(f"{block.id}: line {exc.lineno} of the block does not parse: {exc.msg}\n{block.source}")
    except ValueError as exc:
        pytest.fail(f"{block.id}: {exc}")
    assert not missing, f"{block.id} uses {', '.join(missing)} without defining or importing it:\n{block.source}"


@pytest.mark.parametrize("block", ALL, ids=lambda block: block.id)
def test_the_block_imports_what_exists(block: Block):
    try:
        ast.parse(block.source)
    except SyntaxError:
        pytest.skip("does not parse (the test above fails)")
    assert not import_problems(block), f"{block.id}: {import_problems(block)}"


@pytest.mark.parametrize(("source", "missing"), [
    ("import os\nprint(os.sep, len([]), __name__, __file__)", []),
    ("print(gym)", ["gym"]),
    ("def f():\n    return rows\n", ["rows"]),
    ("def f(x):\n    def g():\n        return x\n    return g", []),
    ("class C:\n    a = 1\n    def m(self):\n        return a\n", ["a"]),  # a class body is no enclosing scope
    ("class C:\n    a = 1\n    b = [a for _ in range(2)]\n", ["a"]),
    ("[y for y in range(3)]\nprint(y)", ["y"]),
    ("def f():\n    return [z for y in range(3) if (z := y)]\n", []),
    ("def f():\n    global G\n    G = 1\nf()\nprint(G)", []),
    ("try:\n    pass\nexcept OSError as e:\n    print(e)\nwith open('x') as fh:\n    print(fh)", []),
    ("async def f(request):\n    async with request as r:\n        return [x async for x in r]", []),
    ("def f(body: Body) -> Reply:\n    return body", ["Body", "Reply"]),
    ("lambda x: x + y", ["y"]),
])
def test_the_name_check(source, missing):
    assert undefined_names(source) == missing


def test_the_name_check_refuses_star_imports_and_reads_continued_blocks():
    with pytest.raises(ValueError, match="star import from os"):
        undefined_names("from os import *\nprint(sep)")
    first = Block(REPO / "README.md", 1, "import json\nrows = []\n", "", None)
    second = Block(REPO / "README.md", 9, "print(json.dumps(rows))\n", CONTINUES, first)
    assert undefined_names(second.source, given_by_above(second)) == []
    assert undefined_names(second.source, given_by_above(Block(REPO, 9, second.source, "", first))) == ["json", "rows"]


def test_the_import_check_names_what_does_not_exist():
    source = ("import json, no_such_module_here\nfrom nemo_gym_env.launch import bundled_spec, no_such_name\n"
              "from nemo_gym_env import launch\nfrom my_envs import Counter\n")
    block = Block(REPO / "docs" / "bring_your_env.md", 1, source, "", None)  # my_envs.py: a file of that page
    assert import_problems(block) == ["no module 'no_such_module_here' (not installed, not a file of this example)",
                                      "nemo_gym_env.launch has no 'no_such_name'"]


# ---- docs/ blocks that no other page's test runs, run as a user runs them -------------------------


def _block(doc: str, needle: str) -> Block:
    [block] = [b for b in python_blocks(REPO / "docs" / doc) if needle in b.source]
    return block


def _run(args: list[str], folder: Path) -> str:
    from .cli.conftest import cli_env

    done = subprocess.run([sys.executable, *args], cwd=folder, env=cli_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_the_porting_pages_cart_server_keeps_one_cart_per_session_and_frees_it(tmp_path):
    """docs/porting.md's server on ``self.sessions``, as ``app.py``, played in process by two clients."""
    (tmp_path / "app.py").write_text(_block("porting.md", "self.sessions").source)
    driver = textwrap.dedent("""
        from app import CartServer
        from nemo_gym_env.server.testing import app_client, assistant_message, verify

        row = {"responses_create_params": {"input": "Add milk."}, "initial_items": ["eggs"],
               "expected_items": ["eggs", "milk"]}
        server = CartServer.from_config({}, name="cart")
        with app_client(server) as client, app_client(server) as other:
            for each in (client, other):
                each.post("/seed_session", json=row).raise_for_status()
            print(client.post("/add_item", json={"item": "milk"}).json(), len(server.sessions))
            print(verify(client, row, [assistant_message("Done.")])["reward"],
                  verify(other, row, [assistant_message("Done.")])["reward"], len(server.sessions))
    """)
    assert _run(["-c", driver], tmp_path).splitlines() == ["{'num_items': 2} 2", "1.0 0.0 0"]


@pytest.mark.slow  # starts a server
def test_the_porting_pages_launch_block_plays_a_server_folder(tmp_path):
    """Its ``my_server`` folder is what ``nemo-gym-env init my_server`` makes (a server whose tool is ``add``)."""
    from nemo_gym_env.server.scaffold import init_server

    init_server("my_server", tmp_path)
    assert _run(["-c", _block("porting.md", "Launcher()").source], tmp_path).splitlines() == ["['add']"]


@pytest.mark.slow  # starts a server
def test_the_rollouts_pages_reading_block_reads_what_rollouts_wrote(tmp_path):
    _run(["-m", "nemo_gym_env.cli", "rollouts", "example_single_tool_call", "--policy", "scripted"], tmp_path)
    assert _run(["-c", _block("rollouts.md", "read_rollouts").source], tmp_path).splitlines() == ["5 1.0"]
