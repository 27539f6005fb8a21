"""Fixtures of the interop tests: the NeMo Gym 0.4.0 virtualenv and one ``ng_run`` for the session.

(The 0.7.0 suite, ``test_v07_*.py``, has its virtualenv and standalone servers in :mod:`.ng07`.)

The NeMo Gym side runs in a Python 3.12 virtualenv made by ``scripts/interop_venv.sh``. Its
python is ``$NEMO_GYM_INTEROP_PYTHON``, else ``<venv>/bin/python`` with ``<venv>`` =
``$NEMO_GYM_INTEROP_VENV`` or ``~/.cache/nemo_gym_env/interop-venv``. When it is missing
(and ``$NEMO_GYM_INTEROP_PYTHON`` is not set) the first test that needs it builds it with
that script (pip, a few minutes, once; ``NEMO_GYM_INTEROP_BUILD=0`` turns this off). When it
still cannot be had (no Python 3.12, no package index), the tests that need NeMo Gym skip and
say why; with ``NEMO_GYM_INTEROP_REQUIRED=1`` (CI) they fail instead. ``test_porting.py``
needs no NeMo Gym and always runs.

One ``ng_run`` serves all of tests/interop (:func:`ng_stack`, stopped when they are done): NeMo Gym's own
example_single_tool_call, example_multi_step, example_session_state_mgmt and mcqa servers,
the port fixture unmodified, and NeMo Gym's simple_agent in front of each of our bundled
servers (which our launcher started: the ``launched`` fixture) with NeMo Gym's openai_model
pointing at a scripted OpenAI-compatible model (:mod:`tests.interop.scripted_model`), plus one
more simple_agent behind NeMo Gym's vllm_model (Chat Completions) for the session server.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from .ngstack import EXTERNAL_SERVER_SCRIPT, NgRun, ng_env, site_packages
from .porting import FIXTURE, port_folder
from .scripted_model import ScriptedModelServer

NEMO_GYM_VERSION = "0.4.0"
PYTHON_ENV = "NEMO_GYM_INTEROP_PYTHON"
VENV_ENV = "NEMO_GYM_INTEROP_VENV"
REQUIRED_ENV = "NEMO_GYM_INTEROP_REQUIRED"
BUILD_ENV = "NEMO_GYM_INTEROP_BUILD"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "interop_venv.sh"

FIXTURE_SERVER = FIXTURE
THEIR_SERVERS = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt", "mcqa"]
"""NeMo Gym's own servers the tests start (by implementation name)."""
SHARED_SERVERS = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt"]
"""The example servers both projects ship (our bundled ones launched by the ``launched`` fixture)."""
MODEL_INSTANCE = "scripted_policy"
"""NeMo Gym's openai_model (Responses API: ``POST /v1/responses``) in front of the scripted model."""
CHAT_MODEL_INSTANCE = "scripted_policy_chat"
"""NeMo Gym's vllm_model (Chat Completions: ``POST /v1/chat/completions``) in front of the scripted model."""
CHAT_AGENT_SERVER = "example_session_state_mgmt"
"""The one server also played through the Chat Completions model server."""


def agent_name(server: str) -> str:
    """Name of the NeMo Gym simple_agent instance (openai_model) in front of our bundled ``server``."""
    return f"ours_{server}_simple_agent"


def chat_agent_name(server: str) -> str:
    """Name of the NeMo Gym simple_agent instance (vllm_model) in front of our bundled ``server``."""
    return f"ours_{server}_chat_agent"


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def our_rows(server: str) -> list[dict[str, Any]]:
    from nemo_gym_env.launch.catalog import bundled_dataset

    return read_rows(bundled_dataset(server))


def our_player(server: str) -> Any:
    return importlib.import_module(f"nemo_gym_env.servers.{server}.scripted").scripted_action


# ---- the port fixture on our side (no NeMo Gym needed) ------------------------------------------


@pytest.fixture(scope="package")
def ported_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fixture server folder whose app.py imports nemo_gym_env instead of nemo_gym."""
    return port_folder(FIXTURE, tmp_path_factory.mktemp("port") / "ng_style_server")


@pytest.fixture(scope="package")
def ported_url(ported_server: Path) -> Iterator[str]:
    """The ported server, launched by our Launcher from its (NeMo Gym format) YAML."""
    from nemo_gym_env.launch.config import load_config, server_specs
    from nemo_gym_env.launch.launcher import Launcher

    [spec] = server_specs(load_config([ported_server / "configs" / "ng_style_server.yaml"], env_yaml=None))
    with Launcher() as launcher:
        yield launcher.start(spec).url


# ---- the interop venv ---------------------------------------------------------------------------


def find_interop_python() -> tuple[Path | None, str]:
    """The interop venv's python, or None and why not."""
    explicit = os.environ.get(PYTHON_ENV)
    venv = Path(os.environ.get(VENV_ENV) or Path.home() / ".cache" / "nemo_gym_env" / "interop-venv")
    python = Path(explicit) if explicit else venv / "bin" / "python"
    where = f"${PYTHON_ENV}={explicit}" if explicit else str(python)
    if not python.is_file():
        return None, f"no NeMo Gym interop venv at {where}"
    if not (python.parent / "ng_run").is_file():
        return None, f"{where} has no ng_run next to it (is it the interop venv?)"
    try:
        out = subprocess.run(  # noqa: PLW1510  (returncode is checked below)
            [str(python), "-c", "import importlib.metadata as m; print(m.version('nemo-gym'))"],
            capture_output=True, text=True, timeout=60, env=ng_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{where} does not run: {exc}"
    version = out.stdout.strip()
    if out.returncode != 0 or version != NEMO_GYM_VERSION:
        return None, f"{where} has nemo-gym {version or '(none)'}, the tests need {NEMO_GYM_VERSION}"
    return python.absolute(), ""


def build_interop_venv(timeout_s: float = 1500.0) -> str:
    """Run ``scripts/interop_venv.sh``; returns what went wrong ("" when it worked)."""
    try:
        done = subprocess.run(  # noqa: PLW1510  (returncode is checked below)
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout_s,
            stdin=subprocess.DEVNULL, env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scripts/interop_venv.sh failed: {exc}"
    if done.returncode != 0:
        return f"scripts/interop_venv.sh exited {done.returncode}: {done.stderr.strip()[-1500:]}"
    return ""


@pytest.fixture(scope="session")
def ng_python() -> Path:
    """The interop venv's python, built when missing; skips (fails under
    ``NEMO_GYM_INTEROP_REQUIRED=1``) when it cannot be had."""
    python, reason = find_interop_python()
    if python is None and not os.environ.get(PYTHON_ENV) and os.environ.get(BUILD_ENV, "1") != "0":
        failure = build_interop_venv()
        python, reason = find_interop_python()
        reason = f"{reason} ({failure})" if failure else reason
    if python is None:
        message = (
            f"{reason}. Run scripts/interop_venv.sh (builds a Python 3.12 venv with nemo-gym=="
            f"{NEMO_GYM_VERSION} from PyPI) and set {PYTHON_ENV}=<venv>/bin/python."
        )
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def ng_site_packages(ng_python: Path) -> Path:
    """The installed NeMo Gym wheel's root: ``resources_servers/``, ``responses_api_agents/``, ..."""
    return site_packages(ng_python)


def their_rows_path(ng_site_packages: Path, server: str) -> Path:
    """NeMo Gym's shipped example data of one of its servers."""
    return ng_site_packages / "resources_servers" / server / "data" / "example.jsonl"


# ---- the one ng_run of tests/interop --------------------------------------------------------------


@dataclass
class NgStack:
    """The running NeMo Gym side. ``their_urls``: implementation name -> URL of NeMo Gym's server."""

    run: NgRun
    site_packages: Path
    their_urls: dict[str, str]
    model: ScriptedModelServer
    our_urls: dict[str, str]


def _their_config(ng_site_packages: Path) -> dict[str, Any]:
    """NeMo Gym's own YAML of each server, keeping only the resources server instances.

    Their YAMLs also define a simple_agent whose model ``policy_model`` we do not run.
    """
    config: dict[str, Any] = {}
    for server in THEIR_SERVERS:
        path = ng_site_packages / "resources_servers" / server / "configs" / f"{server}.yaml"
        for name, block in yaml.safe_load(path.read_text()).items():
            if isinstance(block, dict) and "resources_servers" in block:
                config[name] = block
    return config


def _our_config(our_urls: dict[str, str], model_base_url: str) -> tuple[dict[str, Any], dict]:
    """NeMo Gym simple_agents (and openai_model) in front of our servers, which run already."""
    from nemo_gym_env.launch.catalog import bundled_spec

    config: dict[str, Any] = {
        MODEL_INSTANCE: {"responses_api_models": {"openai_model": {
            "entrypoint": "app.py",
            "openai_base_url": model_base_url,
            "openai_api_key": "unused-by-the-scripted-model",
            "openai_model": "scripted",
        }}},
        CHAT_MODEL_INSTANCE: {"responses_api_models": {"vllm_model": {
            "entrypoint": "app.py",
            "base_url": model_base_url,
            "api_key": "unused-by-the-scripted-model",
            "model": "scripted",
            "return_token_id_information": False,
            "uses_reasoning_parser": False,
        }}},
    }
    local: dict[tuple[str, str], dict[str, str]] = {}
    for server, url in our_urls.items():
        host, port = url.removeprefix("http://").rsplit(":", 1)
        instance = f"ours_{server}"
        config[instance] = {"resources_servers": {instance: {
            "entrypoint": "external_server.py",
            "domain": bundled_spec(server).config.get("domain") or "other",
            "host": host,
            "port": int(port),
        }}}
        local[("resources_servers", instance)] = {
            "requirements.txt": "# runs elsewhere: started by nemo_gym_env's launcher\n",
            "external_server.py": EXTERNAL_SERVER_SCRIPT,
        }
        config[agent_name(server)] = {"responses_api_agents": {"simple_agent": {
            "entrypoint": "app.py",
            "resources_server": {"type": "resources_servers", "name": instance},
            "model_server": {"type": "responses_api_models", "name": MODEL_INSTANCE},
        }}}
        if server == CHAT_AGENT_SERVER:
            config[chat_agent_name(server)] = {"responses_api_agents": {"simple_agent": {
                "entrypoint": "app.py",
                "resources_server": {"type": "resources_servers", "name": instance},
                "model_server": {"type": "responses_api_models", "name": CHAT_MODEL_INSTANCE},
            }}}
    return config, local


@pytest.fixture(scope="package")
def ng_stack(ng_python: Path, ng_site_packages: Path, launched: dict[str, str],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[NgStack]:
    """Start everything the NeMo Gym side needs with one ``ng_run``; stop it at the end."""
    workdir = tmp_path_factory.mktemp("ng_run")
    config = _their_config(ng_site_packages)
    config.update(yaml.safe_load((FIXTURE_SERVER / "configs" / "ng_style_server.yaml").read_text()))
    local = {("resources_servers", "ng_style_server"): {
        name: (FIXTURE_SERVER / name).read_text() for name in ("app.py", "requirements.txt")
    }}
    rows = {server: our_rows(server) for server in SHARED_SERVERS}
    players = {server: our_player(server) for server in SHARED_SERVERS}
    with ScriptedModelServer(rows, players) as model:
        ours, ours_local = _our_config({s: launched[s] for s in SHARED_SERVERS}, model.base_url)
        config.update(ours)
        local.update(ours_local)
        run = NgRun(ng_python, workdir, config, local)
        try:
            run.start()
            their_urls = {}
            for name, block in config.items():
                [(server_type, impls)] = block.items()
                [impl] = impls
                if server_type == "resources_servers" and not name.startswith("ours_"):
                    their_urls[impl] = run.urls[name]
            yield NgStack(run, ng_site_packages, their_urls, model, dict(launched))
        finally:
            run.stop()
            if os.environ.get("NEMO_GYM_INTEROP_KEEP_LOGS") != "1":
                shutil.rmtree(workdir / "cache", ignore_errors=True)
