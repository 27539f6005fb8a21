"""Sockets and addresses of servers: bind, name, probe. Standard library only.

Both sides use these: the launcher binds a server's socket and probes it, the server process
serves on it, the head server binds its own, and clients build URLs.
"""

from __future__ import annotations

import ipaddress
import socket

from nemo_gym_env.errors import LaunchError

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "answers_ok", "http_url", "is_loopback", "listen_socket"]

DEFAULT_HOST = "127.0.0.1"
"""Servers bind loopback unless told otherwise."""

DEFAULT_PORT = 8000
"""The port of a server run by hand (``python app.py``) without ``port=``."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port) and listening; :class:`LaunchError` if it cannot be.

    Made with its protocol named (``IPPROTO_TCP``): asyncio sets ``TCP_NODELAY`` only on connections
    accepted from such a socket, and without it a reply written in two parts (uvicorn writes the head,
    then the body) waits for the client's delayed ACK, about 40 ms per request on Linux.
    """
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise LaunchError(f"cannot resolve host {host!r}: {exc}") from None
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise LaunchError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another port or leave it unset for a free one"
        ) from None
    return sock


def http_url(host: str, port: int) -> str:
    """``http://host:port``, with an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def answers_ok(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``GET /`` on ``host:port`` answers with status 200 (one connection, closed after).

    ``timeout_s`` bounds the connect and each read. A plain socket rather than an HTTP library:
    the launcher polls this while the server boots, and it must not import anything that takes
    CPU from that start-up.
    """
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=timeout_s) as conn:
            netloc = http_url(host, port).partition("://")[2]
            conn.sendall(f"GET / HTTP/1.1\r\nHost: {netloc}\r\nConnection: close\r\n\r\n".encode("latin-1"))
            head = b""
            while b"\r\n" not in head and len(head) < 8192:
                chunk = conn.recv(8192)
                if not chunk:
                    break
                head += chunk
    except OSError:  # refused, reset, timed out
        return False
    status_line = head.partition(b"\r\n")[0].split()
    return len(status_line) >= 2 and status_line[0].startswith(b"HTTP/") and status_line[1] == b"200"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
