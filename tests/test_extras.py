"""Every extra an install line names exists, spelled as pip looks it up (PEP 685), so pip warns about none.

pip normalizes a requested extra (``reasoning_gym`` -> ``reasoning-gym``) and compares it with the
normalized names the package declares; a name that matches none is skipped with only a warning,
and its dependencies are silently missing.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
# ".[a,b]", 'nemo-gym-env[a]', "/path/to/nemo_gym_env'[a]'" on a line that runs pip
_NAMED = re.compile(r"""(?:\.|nemo-gym-env|nemo_gym_env)['"]?\[([A-Za-z0-9_.,\- ]+)\]""")


def normalized(name: str) -> str:
    """PEP 685 (and PEP 503): runs of ``-``, ``_`` and ``.`` become one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _documents() -> list[Path]:
    found = [REPO / "README.md", REPO / ".ci" / "run", *sorted((REPO / "docs").rglob("*.md"))]
    for folder in ("servers", "recipes", "benchmarks", "examples", "nemo_gym_env", "adapters"):
        found += sorted(p for p in (REPO / folder).rglob("*") if p.suffix in (".md", ".py", ".yaml"))
    return [p for p in found if p.is_file()]


def _named_extras() -> list[tuple[str, str]]:
    named = []
    for path in _documents():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "pip install" in line:
                for group in _NAMED.findall(line):
                    named += [(f"{path.relative_to(REPO)}:{number}", e.strip()) for e in group.split(",")]
    return named


def test_the_readme_names_extras_at_all():
    places = {where.split(":")[0] for where, _ in _named_extras()}
    assert "README.md" in places  # .ci/run runs the README's commands (tests/test_readme_commands.py)


def test_declared_extras_are_in_their_normalized_form():
    assert [name for name in EXTRAS if name != normalized(name)] == []


@pytest.mark.parametrize("where,extra", _named_extras())
def test_every_extra_named_in_an_install_line_exists(where, extra):
    assert extra == normalized(extra), f"{where}: write {normalized(extra)!r}, the name pip looks up"
    assert extra in EXTRAS, f"{where}: no extra {extra!r} in pyproject.toml (it has {', '.join(EXTRAS)})"


def test_extras_that_name_other_extras_name_existing_ones():
    for name, requirements in EXTRAS.items():
        for requirement in requirements:
            match = re.match(r"nemo-gym-env\[([^\]]+)\]", requirement)
            for extra in (match.group(1).split(",") if match else []):
                assert extra.strip() in EXTRAS and extra.strip() == normalized(extra), (name, extra)
