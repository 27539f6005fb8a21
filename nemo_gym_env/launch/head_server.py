"""The head server: tells clients where every launched server is, never what its secrets are.

NeMo Gym's ``ng_run`` starts a head server (port 11000) whose ``GET /global_config_dict_yaml``
returns the whole merged config, each server instance's ``host``/``port`` filled in, as a
JSON-encoded YAML string. NeMo Gym serves API keys there; ours serves the same document with
every secret redacted. Routes:

- ``GET /`` -> ``{"status": "ok"}``
- ``GET /global_config_dict_yaml`` -> the redacted config as YAML, JSON-encoded (NeMo Gym's
  contract: ``yaml.safe_load(response.json())``)
- ``GET /servers`` -> ``{instance name: base URL}``
- ``GET /server_instances`` -> one record per server (name, type, host, port, url, pid, status)

Example:
    >>> from nemo_gym_env.client.head_client import fetch_servers
    >>> from nemo_gym_env.launch import Launcher, bundled_spec
    >>> with Launcher() as launcher:                                     # doctest: +SKIP
    ...     procs = launcher.start_all([bundled_spec("example_multi_step")])
    ...     with HeadServer(cfg, procs, port=0) as head:
    ...         print(fetch_servers(head.url))
    {'example_multi_step': 'http://127.0.0.1:41234'}
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_gym_env.errors import LaunchError
from nemo_gym_env.launch.launcher import ServerProcess
from nemo_gym_env.system.hosts import HostCheckMiddleware, HostPolicy
from nemo_gym_env.system.net import DEFAULT_HOST, answers_ok, http_url, listen_socket
from nemo_gym_env.system.redaction import redact, scrub, secret_values

__all__ = [
    "DEFAULT_HEAD_PORT",
    "HEAD_SERVER_KEY",
    "HeadServer",
    "head_address",
    "public_config",
]

HEAD_SERVER_KEY = "head_server"
"""Top-level config key holding the head server's ``host`` and ``port`` (as in NeMo Gym)."""

DEFAULT_HEAD_PORT = 11000
"""NeMo Gym's head server port."""


# ---- the document ------------------------------------------------------------------------------


def _resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain containers, interpolations resolved where they can be (per top-level key)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException:
        pass
    out = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    for key, raw in list(out.items()):
        try:
            if isinstance(raw, (dict, list)):
                out[key] = OmegaConf.to_container(cfg[key], resolve=True, throw_on_missing=False)
            elif isinstance(raw, str) and "${" in raw:
                out[key] = OmegaConf.select(cfg, str(key), throw_on_missing=False)
        except OmegaConfBaseException:
            pass  # keep the unresolved text: a dangling ${...} is not a secret
    return out


def public_config(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config with every secret redacted: safe to print, log or serve.

    Values under secret-looking keys (``*api_key``, ``*token*``, ``*secret*``, ``password``...)
    are replaced by :data:`~nemo_gym_env.system.redaction.REDACTED`, and so is every copy of such a value
    that an interpolation carried into another key (``base_url: ${policy_api_key}``).

    Example:
        >>> from omegaconf import OmegaConf
        >>> public_config(OmegaConf.create({"policy_api_key": "sk-live-1234", "echo": "${policy_api_key}"}))
        {'policy_api_key': '***REDACTED***', 'echo': '***REDACTED***'}
    """
    if isinstance(cfg, DictConfig):
        resolved = _resolved(cfg)
        raw = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    else:
        resolved = copy.deepcopy(dict(cfg))
        raw = resolved
    return scrub(redact(resolved), secret_values(resolved) | secret_values(raw))


def head_address(cfg: DictConfig | Mapping[str, Any]) -> tuple[str, int]:
    """``(host, port)`` of the head server from ``head_server`` in the config (default 127.0.0.1:11000)."""
    block = cfg.get(HEAD_SERVER_KEY) if hasattr(cfg, "get") else None
    if OmegaConf.is_config(block):
        block = OmegaConf.to_container(block, resolve=True)
    block = block if isinstance(block, Mapping) else {}
    host = str(block.get("host") or DEFAULT_HOST)
    port = block.get("port", DEFAULT_HEAD_PORT)
    try:
        port = int(DEFAULT_HEAD_PORT if port is None else port)
    except (TypeError, ValueError):
        raise LaunchError(f"head_server.port must be an integer, got {port!r}; e.g. +head_server.port=11000") from None
    if not 0 <= port <= 65535:
        raise LaunchError(f"head_server.port must be in 0..65535 (0 = a free port), got {port}")
    return host, port


def head_allowed_hosts(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """``head_server.allowed_hosts`` of the config: names the head server answers to besides its own."""
    block = cfg.get(HEAD_SERVER_KEY) if hasattr(cfg, "get") else None
    if OmegaConf.is_config(block):
        block = OmegaConf.to_container(block, resolve=True)
    names = block.get("allowed_hosts") if isinstance(block, Mapping) else None
    if names is None:
        return []
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise LaunchError(f"head_server.allowed_hosts must be a list of names, got {names!r}")
    return list(names)


def global_config_dict(
    cfg: DictConfig | Mapping[str, Any], processes: Iterable[ServerProcess], head: tuple[str, int]
) -> dict[str, Any]:
    """NeMo Gym's global config document: :func:`public_config` plus each server's host and port."""
    doc = public_config(cfg)
    for proc in processes:
        spec = proc.spec
        block = doc.setdefault(spec.instance_name, {})
        impls = block.setdefault(spec.server_type, {}) if isinstance(block, dict) else {}
        impl = impls.setdefault(spec.impl_name, {}) if isinstance(impls, dict) else {}
        if isinstance(impl, dict):
            impl["host"], impl["port"] = proc.host, proc.port
    doc[HEAD_SERVER_KEY] = {"host": head[0], "port": head[1]}
    return doc


# ---- the server --------------------------------------------------------------------------------


class HeadServer:
    """The head server, served by uvicorn on a background thread of this process.

    Args:
        cfg: The merged config (secrets in it are never served).
        processes: The launched servers it reports (may be set later, before :meth:`start`).
        host: Address to bind (default 127.0.0.1).
        port: Port to bind; 0 picks a free one (see :attr:`port` afterwards).

    Raises:
        LaunchError: If the address cannot be bound (e.g. 11000 is taken: pass ``port=0``).
    """

    def __init__(
        self,
        cfg: DictConfig | Mapping[str, Any],
        processes: Sequence[ServerProcess] = (),
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_HEAD_PORT,
    ):
        self._sock = listen_socket(host, port)  # bound now: a taken port fails before any server starts
        self.host = host
        self.port = self._sock.getsockname()[1]
        self.url = http_url(host, self.port)
        self.cfg = cfg
        self.processes = list(processes)
        self._yaml = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def servers(self) -> dict[str, str]:
        """``{instance name: base URL}`` of every reported server."""
        return {proc.name: proc.url for proc in self.processes}

    def build_app(self) -> Any:
        """The FastAPI app with the head routes."""
        from fastapi import FastAPI

        app = FastAPI(title="nemo-gym-env head server", docs_url=None, redoc_url=None, openapi_url=None)
        # Only its own names (DNS rebinding: a page must not read the config through a name of its own).
        app.add_middleware(HostCheckMiddleware, policy=HostPolicy(self.host, head_allowed_hosts(self.cfg)),
                           label="the head server")

        @app.get("/")
        async def liveness() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/global_config_dict_yaml")
        async def global_config_dict_yaml() -> str:
            return self._yaml

        @app.get("/servers")
        async def servers() -> dict[str, str]:
            return self.servers()

        @app.get("/server_instances")
        async def server_instances() -> list[dict[str, Any]]:
            return [
                {
                    "name": p.name,
                    "server_type": p.spec.server_type,
                    "impl_name": p.spec.impl_name,
                    "host": p.host,
                    "port": p.port,
                    "url": p.url,
                    "pid": p.pid,
                    "status": p.status,
                    "restarts": p.restarts,
                }
                for p in self.processes
            ]

        return app

    def start(self) -> Self:
        """Serve on a daemon thread; returns once it answers ``GET /``."""
        import uvicorn

        doc = global_config_dict(self.cfg, self.processes, (self.host, self.port))
        self._yaml = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
        config = uvicorn.Config(self.build_app(), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="nemo-gym-env-head", daemon=True
        )
        self._thread.start()
        for _ in range(200):
            if answers_ok(self.host, self.port, 1.0):
                return self
            if not self._thread.is_alive():
                break
            threading.Event().wait(0.025)
        self.stop()
        raise LaunchError(f"the head server at {self.url} did not start")

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._thread = None
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
