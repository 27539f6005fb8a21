"""The client side of the wire: everything that sends requests to a server.

- :mod:`~nemo_gym_env.client.transport`: the one HTTP transport (:class:`HttpClient`), used by
  the resources client, the head-server client and the HTTP policies;
- :mod:`~nemo_gym_env.client.resources`: :class:`ResourcesClient`, one episode's calls to a
  resources server with its own cookie jar;
- :mod:`~nemo_gym_env.client.head_client`: where the servers behind a head server are;
- :mod:`~nemo_gym_env.client.loop`: the background event loop behind every synchronous API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.client.head_client import (
        fetch_global_config,
        fetch_servers,
        server_urls_from_global_config,
    )
    from nemo_gym_env.client.loop import BackgroundLoop, background_loop
    from nemo_gym_env.client.resources import CookieJar, ResourcesClient
    from nemo_gym_env.client.transport import MAX_CONNECTIONS_PER_ORIGIN, HttpClient, Reply
    from nemo_gym_env.errors import ServerError
    from nemo_gym_env.protocol.types import TOOL_NAME_RE

__all__ = [
    "MAX_CONNECTIONS_PER_ORIGIN",
    "TOOL_NAME_RE",
    "BackgroundLoop",
    "CookieJar",
    "HttpClient",
    "Reply",
    "ResourcesClient",
    "ServerError",
    "background_loop",
    "fetch_global_config",
    "fetch_servers",
    "server_urls_from_global_config",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("fetch_global_config", "fetch_servers", "server_urls_from_global_config"),
                    "nemo_gym_env.client.head_client"),
    **dict.fromkeys(("BackgroundLoop", "background_loop"), "nemo_gym_env.client.loop"),
    **dict.fromkeys(("CookieJar", "ResourcesClient"), "nemo_gym_env.client.resources"),
    **dict.fromkeys(("HttpClient", "MAX_CONNECTIONS_PER_ORIGIN", "Reply"), "nemo_gym_env.client.transport"),
    "ServerError": "nemo_gym_env.errors",
    "TOOL_NAME_RE": "nemo_gym_env.protocol.types",
})
