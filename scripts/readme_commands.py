"""The README's commands that CI runs as written: found by their markers, never copied.

README.md marks each such command with an HTML comment on the line before its fenced block::

    <!-- command: main-job -->
    ```bash
    python3 -m venv .venv && ... && nemo-gym-env rollouts
    ```

``.ci/run`` and ``scripts/first_contact.py`` run what the block holds, so the README and CI
cannot drift apart. Standard library only: it runs before any virtualenv exists.

    python3 scripts/readme_commands.py tests       # prints the test command
    python3 scripts/readme_commands.py main-job    # prints the main-job command
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
NAMES = ("main-job", "tests")
"""The marked commands: the main job a new user runs first, and the contributor's test command."""

_BLOCK = re.compile(r"^<!-- command: (?P<name>[\w-]+) -->\n```(?:bash|sh)?\n(?P<body>.*?)\n```", re.MULTILINE | re.DOTALL)
_EXTRAS = re.compile(r"""pip install -e ["']?\.\[(?P<extras>[^\]]*)\]""")
_STEP = re.compile(r"\s*&&\s*")


class CommandNotFound(LookupError):
    """The README has no marked block of that name, or more than one."""


def readme_commands(text: str | None = None) -> dict[str, str]:
    """Every marked command of the README (``name -> command``), one line each."""
    text = README.read_text(encoding="utf-8") if text is None else text
    found: dict[str, str] = {}
    for match in _BLOCK.finditer(text):
        name, body = match["name"], match["body"].strip()
        if name in found:
            raise CommandNotFound(f"README.md marks two commands {name!r}")
        if "\n" in body:
            raise CommandNotFound(f"README.md's command {name!r} must be one line to paste, got:\n{body}")
        found[name] = body
    return found


def readme_command(name: str, text: str | None = None) -> str:
    """The README's command ``name`` (one of :data:`NAMES`)."""
    commands = readme_commands(text)
    if name not in commands:
        raise CommandNotFound(f"README.md has no command marked <!-- command: {name} --> "
                              f"(it marks: {', '.join(commands) or 'none'})")
    return commands[name]


def named_extras(command: str) -> list[str]:
    """The extras that ``pip install -e ".[a,b]"`` steps of ``command`` name ([] for the core install)."""
    return [e.strip() for m in _EXTRAS.finditer(command) for e in m["extras"].split(",") if e.strip()]


def steps(command: str) -> list[str]:
    """The ``&&``-joined steps of a one-line command."""
    return _STEP.split(command.strip())


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in NAMES:
        print(f"usage: {Path(__file__).name} {{{'|'.join(NAMES)}}}", file=sys.stderr)
        return 2
    try:
        print(readme_command(argv[0]))
    except CommandNotFound as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
