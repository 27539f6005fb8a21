"""The network peers of a set of processes (Linux), two ways.

``PeerWatch`` samples, every ``interval_s``, the TCP and UDP sockets of every process that a
``members`` callable names (from /proc), and keeps each remote address it sees: Ray's C++ processes'
connections are long-lived. A connection of a millisecond falls between samples, so every Python process
of a test cluster also writes each ``connect()`` address down (``connect_log/sitecustomize.py``, loaded
through ``connect_log_env``) and ``connected`` reads them back: Ray's own HTTP requests (cloud metadata, usage
reports) are Python's.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Self

from nemo_gym_env.system.net import is_loopback as net_is_loopback

from .cluster import descendants

TABLES = ("tcp", "tcp6", "udp", "udp6")


def _address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(raw[::-1])
    else:  # four 32-bit words, each in the host's (little-endian) order
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    return ip, int(port, 16)


def socket_table(pid: int) -> dict[int, tuple[str, str, str]]:
    """Socket inode -> (kind, local, remote) of the network namespace ``pid`` is in; remote is "" if none."""
    found: dict[int, tuple[str, str, str]] = {}
    for kind in TABLES:
        try:
            with open(f"/proc/{pid}/net/{kind}") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, inode = _address(fields[1]), _address(fields[2]), int(fields[9])
            peer = "" if remote[0].is_unspecified else f"{remote[0]}:{remote[1]}"
            found[inode] = (kind, f"{local[0]}:{local[1]}", peer)
    return found


CONNECT_LOG = Path(__file__).parent / "connect_log"


def connect_log_env(folder: Path) -> dict[str, str]:
    """What makes the Python processes that get it (and their children) write their connections to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"NEMO_GYM_ENV_TEST_CONNECT_LOG": str(folder), "PYTHONPATH": os.pathsep.join(
        p for p in (str(CONNECT_LOG), os.environ.get("PYTHONPATH")) if p)}


def connected(folder: Path) -> dict[str, set[str]]:
    """``host:port`` -> the processes ("pid argv") that connected to it, from a connect log folder."""
    found: dict[str, set[str]] = {}
    for log in folder.iterdir():
        for line in log.read_text(errors="replace").splitlines():
            host, port, *argv = line.split(" ")
            found.setdefault(f"{host}:{port}", set()).add(f"{log.name} {' '.join(argv)}")
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def is_loopback(peer: str) -> bool:
    """Whether ``host:port`` is on 127.0.0.0/8 or ::1 (:func:`nemo_gym_env.system.net.is_loopback`; an
    IPv4-mapped address counts as its IPv4 one, a name other than ``localhost`` does not)."""
    host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        mapped = ipaddress.ip_address(host)
    except ValueError:
        mapped = None
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
        host = str(mapped.ipv4_mapped)
    return net_is_loopback(host)


def outside_loopback(peers: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The peers (``host:port`` -> who) that are not on loopback."""
    return {peer: owners for peer, owners in peers.items() if not is_loopback(peer)}


def process_tree(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process whose chain of parents leads to one of them."""
    roots = set(roots)
    return roots | {pid for root in roots for pid in descendants(root)}


class PeerWatch:
    """Every remote address the sockets of ``members()`` had, sampled on a thread until ``stop()``."""

    def __init__(self, members: Callable[[], set[int]], interval_s: float = 0.05) -> None:
        self.members, self.interval_s = members, interval_s
        self.peers: dict[str, set[str]] = {}  # peer -> "kind name(pid)" of each owner seen with it
        self.samples = 0
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-watch", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        pids = self.members()
        tables: dict[int, dict[int, tuple[str, str, str]]] = {}  # by network namespace
        for pid in pids:
            inodes = socket_inodes(pid)
            if not inodes:
                continue
            try:
                namespace = os.stat(f"/proc/{pid}/ns/net").st_ino
            except OSError:
                continue
            table = tables.get(namespace)
            if table is None:
                table = tables[namespace] = socket_table(pid)
            for inode in inodes & table.keys():
                kind, _, peer = table[inode]
                if peer:
                    self.connections += 1
                    self.peers.setdefault(peer, set()).add(f"{kind} {_name(pid)}({pid})")
        self.samples += 1

    def outside_loopback(self) -> dict[str, set[str]]:
        return outside_loopback(self.peers)


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return "?"
