"""The client side of a head server: where the servers are (ours, or NeMo Gym's ``ng_run``).

Example:
    >>> fetch_servers("http://127.0.0.1:11000")                       # doctest: +SKIP
    {'example_multi_step': 'http://127.0.0.1:41234'}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.transport import HttpClient, Reply
from nemo_gym_env.errors import ConnectFailed, LaunchError, TransportError
from nemo_gym_env.protocol.keys import SERVER_TYPES
from nemo_gym_env.system.net import http_url

__all__ = ["fetch_global_config", "fetch_servers", "server_urls_from_global_config"]


def _get(head_url: str, path: str, timeout_s: float) -> Reply:
    url = head_url.rstrip("/") + path
    try:
        http = HttpClient(head_url, connect_retries=0)
        reply = background_loop().run(http.request("GET", path, timeout_s=timeout_s))
    except (ValueError, ConnectFailed, TransportError, TimeoutError) as exc:
        raise LaunchError(
            f"cannot reach the head server at {url} ({type(exc).__name__}); is `nemo-gym-env serve` running?"
        ) from None
    if reply.status_code != 200:
        raise LaunchError(f"head server {url} answered HTTP {reply.status_code}: {reply.text[:200]}",
                          status_code=reply.status_code)
    return reply


def fetch_servers(head_url: str, timeout_s: float = 10.0) -> dict[str, str]:
    """``{instance name: base URL}`` of the resources servers behind a running head server.

    Reads ``GET /servers``; a NeMo Gym head server, which has no such route, is read through
    its ``GET /global_config_dict_yaml`` instead.
    """
    try:
        reply = _get(head_url, "/servers", timeout_s)
    except LaunchError as exc:
        if exc.status_code != 404:
            raise
        return server_urls_from_global_config(fetch_global_config(head_url, timeout_s))
    try:
        servers = reply.json()
    except ValueError:
        servers = None
    if not isinstance(servers, dict) or not all(isinstance(v, str) for v in servers.values()):
        raise LaunchError(f"{head_url}/servers did not answer a JSON object of name -> URL; is it a nemo-gym-env head?")
    return servers


def fetch_global_config(head_url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The global config from ``GET /global_config_dict_yaml`` (ours or NeMo Gym's head server)."""
    reply = _get(head_url, "/global_config_dict_yaml", timeout_s)
    try:
        return yaml.safe_load(reply.json())
    except (ValueError, yaml.YAMLError) as exc:
        raise LaunchError(f"{head_url}/global_config_dict_yaml is not a JSON-encoded YAML string: {exc}") from None


def server_urls_from_global_config(
    doc: Mapping[str, Any], server_type: str | None = "resources_servers"
) -> dict[str, str]:
    """``{instance name: URL}`` of the instances of one server type that have a host and port."""
    urls: dict[str, str] = {}
    for name, block in doc.items():
        if not isinstance(block, Mapping):
            continue
        for stype in SERVER_TYPES if server_type is None else (server_type,):
            impls = block.get(stype)
            if isinstance(impls, Mapping):
                for impl in impls.values():
                    if isinstance(impl, Mapping) and impl.get("host") and impl.get("port"):
                        urls[str(name)] = http_url(str(impl["host"]), int(impl["port"]))
    return urls
