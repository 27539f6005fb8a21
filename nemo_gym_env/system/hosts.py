"""Which names a server answers to: ``Host`` and ``Origin`` checks against DNS rebinding. Standard library only.

A server bound to 127.0.0.1 cannot be reached from another machine, but a web page the user
opens can still reach it: its script asks ``evil.example``, whose DNS then answers 127.0.0.1
(DNS rebinding), and the browser sends the request to the loopback server with
``Host: evil.example`` (and, for a cross-site ``fetch``, ``Origin: http://evil.example``).
Checking the name the client asked for closes that door: a server answers only to its own
names (421 Misdirected Request otherwise), and a state-changing request that comes from a page
(it carries ``Origin``) must come from a page of one of those names (403 otherwise).

Its own names: ``localhost`` and the loopback addresses, the address it is bound to, and
whatever ``allowed_hosts`` adds (names or addresses, ``*`` for any). A server bound to every
interface (``0.0.0.0``, ``::``) on purpose, with no ``allowed_hosts``, answers to any name, as
it would on the network; give it ``allowed_hosts`` to narrow that. Requests with no ``Origin``
(every non-browser client: the env, NeMo Gym's agent, ``curl``) are judged by ``Host`` alone.
Requests that did not come over a network socket (an in-process test client, whose peer is not
an IP address) are not checked: rebinding needs a browser's connection.
"""

from __future__ import annotations

import functools
import ipaddress
import json
from collections.abc import Iterable
from typing import Any

from nemo_gym_env.system.net import is_loopback

__all__ = ["HostCheckMiddleware", "HostPolicy", "host_name"]

_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def host_name(value: str) -> str:
    """The name in a ``Host`` header or an origin's authority, without the port, lowercased.

    Example:
        >>> host_name("[::1]:8000"), host_name("LocalHost:11000"), host_name("example.org")
        ('::1', 'localhost', 'example.org')
    """
    host = value.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


class HostPolicy:
    """The names a server bound to ``bind_host`` answers to (see the module docstring).

    Example:
        >>> policy = HostPolicy("127.0.0.1")
        >>> policy.host_ok("127.0.0.1:8000"), policy.host_ok("localhost"), policy.host_ok("evil.example")
        (True, True, False)
        >>> policy.origin_ok("http://localhost:3000"), policy.origin_ok("http://evil.example"), policy.origin_ok("null")
        (True, False, False)
        >>> HostPolicy("127.0.0.1", ["gpu-7.internal"]).host_ok("gpu-7.internal:8000")
        True
    """

    def __init__(self, bind_host: str, allowed_hosts: Iterable[str] = ()):
        self.bind_host = host_name(bind_host)
        self.allowed = frozenset(host_name(h) for h in allowed_hosts if h and h.strip())
        self.any_host = "*" in self.allowed or (_unspecified(self.bind_host) and not self.allowed)

    def name_ok(self, name: str) -> bool:
        """Whether ``name`` (no port) is one of this server's names."""
        return self.any_host or is_loopback(name) or name == self.bind_host or name in self.allowed

    def host_ok(self, host_header: str | None) -> bool:
        """Whether a request's ``Host`` names this server (a request without one is refused)."""
        if not host_header:
            return self.any_host
        return self.name_ok(host_name(host_header))

    def origin_ok(self, origin: str | None) -> bool:
        """Whether a request's ``Origin`` (None: sent by no page) may change state here."""
        if origin is None:
            return True
        scheme, sep, rest = origin.strip().partition("://")
        if not sep or scheme.lower() not in ("http", "https") or not rest:
            return self.any_host and origin.strip() != "null"
        return self.name_ok(host_name(rest.partition("/")[0]))

    def _names(self) -> list[str]:
        names = {"localhost", "127.0.0.1", "::1", self.bind_host, *self.allowed} - {"*"}
        return sorted(f"[{name}]" if ":" in name else name for name in names)

    def host_patterns(self) -> list[str]:
        """The names as ``Host`` values, with ``:*`` for any port (the MCP SDK's allow-list form)."""
        return [form for name in self._names() for form in (name, f"{name}:*")]

    def origin_patterns(self) -> list[str]:
        """The names as page origins, in the MCP SDK's allow-list form."""
        return [form for name in self._names() for scheme in ("http", "https")
                for form in (f"{scheme}://{name}", f"{scheme}://{name}:*")]


class HostCheckMiddleware:
    """An ASGI middleware refusing requests that do not name this server (421) or come from a page of
    another site and change state (403); see the module docstring. ``label`` names the server in the reply."""

    def __init__(self, app: Any, policy: HostPolicy, label: str = "this server"):
        self.app = app
        self.policy = policy
        self.label = label
        # The same few answers are asked at every request: parsed once each, in bounded memories (functools' LRU).
        self._is_address = functools.lru_cache(maxsize=1024)(_is_address)
        self._host_ok = functools.lru_cache(maxsize=1024)(policy.host_ok)

    def refusal(self, scope: dict) -> tuple[int, str] | None:
        """``(status, why)`` when this HTTP request is refused, None when it passes."""
        client = scope.get("client")
        if self.policy.any_host or not client or not self._is_address(str(client[0])):
            return None
        headers = {key: value for key, value in scope.get("headers", ())}
        host = headers.get(b"host", b"").decode("latin-1")
        if not self._host_ok(host):
            return 421, (f"{self.label} answers only to its own names (Host {host[:100]!r} is not one; "
                         "a remote deployment lists its names in allowed_hosts)")
        origin = headers.get(b"origin")
        if scope.get("method") in _CHANGING and not self.policy.origin_ok(
                origin.decode("latin-1") if origin is not None else None):
            return 403, (f"{self.label} takes no state-changing request from a page of another site "
                         f"(Origin {origin.decode('latin-1')[:100]!r})")
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        refused = self.refusal(scope) if scope["type"] == "http" else None
        if refused is not None:
            await _refuse(send, *refused)
            return
        await self.app(scope, receive, send)


async def _refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
