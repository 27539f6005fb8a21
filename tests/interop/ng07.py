"""NeMo Gym 0.7.0 for the interop tests: its virtualenv, and its resources servers run standalone.

The venv is built by ``scripts/interop_venv.sh 0.7.0`` (Python 3.13, ``--ignore-requires-python``;
see docs/porting.md). Its python is ``$NEMO_GYM_INTEROP07_PYTHON``, else ``<venv>/bin/python``
with ``<venv>`` = ``$NEMO_GYM_INTEROP07_VENV`` or ``~/.cache/nemo_gym_env/interop-venv-0.7``;
missing, it is built on first use (``NEMO_GYM_INTEROP_BUILD=0`` turns that off), and when it
still cannot be had the tests skip, or fail under ``NEMO_GYM_INTEROP_REQUIRED=1`` (CI).

A 0.7 resources server whose class sets ``ray_enabled = False`` (all those used here) runs
alone, with no head server and no Ray: ``python app.py "+config_paths=[<yaml>]"`` in its
folder, the instance named by ``NEMO_GYM_CONFIG_PATH`` (:func:`their_server`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from .ngstack import free_port, ng_env, site_packages

VERSION = "0.7.0"
PYTHON_ENV = "NEMO_GYM_INTEROP07_PYTHON"
VENV_ENV = "NEMO_GYM_INTEROP07_VENV"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "interop_venv.sh"


def find_python() -> tuple[Path | None, str]:
    """The 0.7 venv's python, or None and why not."""
    explicit = os.environ.get(PYTHON_ENV)
    venv = Path(os.environ.get(VENV_ENV) or Path.home() / ".cache" / "nemo_gym_env" / "interop-venv-0.7")
    python = Path(explicit) if explicit else venv / "bin" / "python"
    if not python.is_file():
        return None, f"no NeMo Gym {VERSION} venv at {python}"
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('nemo-gym'))"],
                          capture_output=True, text=True, timeout=60, env=ng_env(), check=False)
    if done.returncode != 0 or done.stdout.strip() != VERSION:
        return None, f"{python} has nemo-gym {done.stdout.strip() or '(none)'}, the tests need {VERSION}"
    return python.absolute(), ""


def ng07_python() -> Path:
    """The 0.7 venv's python, built when missing; skips (fails when required) when it cannot be had."""
    python, reason = find_python()
    if python is None and not os.environ.get(PYTHON_ENV) and os.environ.get("NEMO_GYM_INTEROP_BUILD", "1") != "0":
        done = subprocess.run(["bash", str(BUILD_SCRIPT), VERSION], capture_output=True, text=True, timeout=1500,
                              stdin=subprocess.DEVNULL, check=False,
                              env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
        python, reason = find_python()
        if done.returncode != 0:
            reason = f"{reason} (scripts/interop_venv.sh {VERSION} exited {done.returncode}: {done.stderr[-1500:]})"
    if python is None:
        message = f"{reason}. Run scripts/interop_venv.sh {VERSION} and set {PYTHON_ENV}=<venv>/bin/python."
        if os.environ.get("NEMO_GYM_INTEROP_REQUIRED") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


@contextlib.contextmanager
def their_server(python: Path, server: str, workdir: Path, *, domain: str = "other",
                 timeout_s: float = 60.0, **config: Any) -> Iterator[str]:
    """NeMo Gym 0.7's resources server ``server`` run alone on a free loopback port; yields its URL."""
    folder = site_packages(python) / "resources_servers" / server
    port = free_port()
    instance = f"their_{server}"
    block = {"entrypoint": "app.py", "domain": domain, "host": "127.0.0.1", "port": port, **config}
    config_path = workdir / f"{instance}.yaml"
    config_path.write_text(yaml.safe_dump({instance: {"resources_servers": {server: block}}}))
    env = {**ng_env(), "NEMO_GYM_CONFIG_PATH": instance, "PYTHONPATH": str(folder)}
    log = open(workdir / f"{instance}.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen([str(python), "app.py", f"+config_paths=[{config_path}]", "+default_host=127.0.0.1"],
                               cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/", timeout=2, trust_env=False).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"NeMo Gym {VERSION} {server} did not start (exit {process.poll()}): "
                                   f"{(workdir / f'{instance}.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def their_rows(python: Path, server: str) -> list[dict[str, Any]]:
    import json

    path = site_packages(python) / "resources_servers" / server / "data" / "example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
