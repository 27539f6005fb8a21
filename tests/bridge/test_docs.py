"""Every example of docs/bring_your_env.md runs as a user runs it: its files written, its Python run, its
commands run (``serve`` until it is ready, then stopped; ``check`` of a URL against a server we start)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..cli.conftest import CLI, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "bring_your_env.md"
_BLOCK = re.compile(r"(?:<!-- file: (?P<file>\S+) -->\n)?```(?P<lang>\w+)\n(?P<body>.*?)```", re.DOTALL)


def blocks() -> list[tuple[str | None, str, str]]:
    return [(m.group("file"), m.group("lang"), m.group("body")) for m in _BLOCK.finditer(DOC.read_text())]


def _env(folder: Path) -> dict[str, str]:
    """The environment a user has: the page's files are found because the commands run in their folder."""
    return cli_env()


def _serve_until_ready(args: list[str], folder: Path) -> None:
    process = subprocess.Popen([*CLI, *args], cwd=folder, env=_env(folder), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        assert any("server(s) ready" in line for line in lines), "".join(lines)[-3000:]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_every_example_runs(tmp_path):
    from nemo_gym_env.launch.catalog import bundled_dataset, bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    found = blocks()
    assert sum(lang == "python" for _, lang, _ in found) >= 4 and sum(lang == "bash" for _, lang, _ in found) >= 4
    for file, _, body in found:
        if file:
            (tmp_path / file).write_text(body)
    ran = []
    with Launcher() as launcher:
        url = launcher.start(bundled_spec("guess_number")).url
        (tmp_path / "tasks.jsonl").write_text(bundled_dataset("guess_number").read_text())
        for file, lang, body in found:
            if file or lang not in ("python", "bash"):
                continue
            if lang == "python":
                done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, env=_env(tmp_path),
                                      capture_output=True, text=True, timeout=600, check=False)
                assert done.returncode == 0, body + done.stderr[-3000:]
                ran.append("python")
                continue
            for line in body.strip().splitlines():
                words = shlex.split(line)
                if words[:2] == ["pip", "install"]:
                    continue  # the extra is installed here (tests/test_extras.py checks its name)
                if words[:2] == ["nemo-gym-env", "serve"]:
                    _serve_until_ready(words[1:], tmp_path)
                elif words[0] == "nemo-gym-env":
                    args = [url if w == "http://127.0.0.1:8000" else w for w in words[1:]]
                    done = subprocess.run([*CLI, *args], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                                          text=True, timeout=600, check=False)
                    assert done.returncode == 0, line + done.stdout[-2000:] + done.stderr[-2000:]
                else:
                    assert words[:3] == ["python", "-m", "nemo_gym_env.bridge.datasets"], line
                    done = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, env=_env(tmp_path),
                                          capture_output=True, text=True, timeout=600, check=False)
                    assert done.returncode == 0, line + done.stderr[-2000:]
                ran.append(words[1])
    train = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    heldout = [json.loads(x) for x in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in train] == list(range(200)) and len(heldout) == 50
    assert not {r["seed"] for r in train} & {r["seed"] for r in heldout}
    assert (tmp_path / "my_env" / "configs" / "my_env.yaml").is_file()  # init ran, and check passed on it
    assert ran.count("serve") == 4 and ran.count("check") == 5 and ran.count("python") >= 4



def test_a_module_of_the_folder_imports_from_a_relative_pythonpath_too_and_a_broken_one_is_named(tmp_path):
    """``check`` from the folder holding the page's module: with no PYTHONPATH (above), with ``PYTHONPATH=.``
    (relative: the server runs in another folder), and with a module that really does not import: one line
    that names the env and the module's own error, no traceback."""
    for name, lang, body in blocks():
        if name:
            (tmp_path / name).write_text(body)
    config = next(name for name, _, _ in blocks() if name and name.endswith(".yaml"))
    env = {**_env(tmp_path), "PYTHONPATH": os.pathsep.join(p for p in (".", cli_env().get("PYTHONPATH")) if p)}
    done = subprocess.run([*CLI, "check", config], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    module = tmp_path / "my_envs.py"
    module.write_text(module.read_text() + "\nimport a_module_nobody_installed\n")
    done = subprocess.run([*CLI, "check", config], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert lines == [("nemo-gym-env: error: my_envs:Counter: formatter 'my_envs:describe': module 'my_envs' does not "
                      "import: ModuleNotFoundError: No module named 'a_module_nobody_installed'")], done.stderr
    assert "Traceback" not in done.stderr
