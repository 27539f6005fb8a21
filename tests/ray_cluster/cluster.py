"""A two-node Ray cluster on this machine, for tests and benchmarks: a head node and a worker node, each its own
process group (2 CPUs each by default, the shape of a small real cluster).

Each node is ``ray start ... --block`` in a new session, so stopping a node is a signal to
its process group: this cluster's processes only, never another Ray on the same machine
(``ray stop --force`` would kill every Ray process of the user). Token authentication uses
a token made for this cluster (``RAY_AUTH_TOKEN``), handed to the nodes and to this process.

Every connection stays on 127.0.0.0/8 (``test_loopback.py`` reads the sockets): the head is 127.0.0.2 and
worker n 127.0.0.(3+n), since Ray 2.60 replaces 127.0.0.1 (and only that loopback address) with the
machine's outward one; the nodes' Ray sends its "usage stats disabled" report to a closed loopback port
and finds a local provider in its home folder's ``ray_bootstrap_config.yaml`` (a folder of the cluster's
own) instead of asking cloud metadata servers what it runs on.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


HEAD_IP = "127.0.0.2"


def worker_ip(n: int) -> str:
    return f"127.0.0.{3 + n}"


def cluster_env() -> dict[str, str]:
    """Environment of the nodes (and of this process, set before ``ray`` is imported)."""
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray kills workers when the machine's memory passes 95%; on a machine shared with other jobs that
        # is their memory, not this cluster's: no killing.
        "RAY_memory_monitor_refresh_ms": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }


def node_env(home: str) -> dict[str, str]:
    """What keeps a node's own Ray off the network: a home with a local provider's bootstrap config, and the
    usage report's address on a closed loopback port (the model cache stays the caller's). And what has each
    Python process of the node write down where it connects (``sockets.connected(home/connect)`` reads it)."""
    from nemo_gym_env.policies.models import cache_dir

    from .sockets import connect_log_env

    logged = connect_log_env(Path(home) / "connect")
    return {"HOME": home, "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/", "NEMO_GYM_ENV_CACHE": str(cache_dir()),
            **logged, "PYTHONPATH": os.pathsep.join((logged["PYTHONPATH"], cluster_env()["PYTHONPATH"]))}


@dataclass
class LocalCluster:
    """A head node (127.0.0.2) and worker nodes (127.0.0.3, ...) started with ``ray start --block``, ``cpus`` CPUs each."""

    address: str = ""
    temp_dir: str = ""
    cpus: int = 2
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ngeray_logs_")))
    nodes: list[subprocess.Popen] = field(default_factory=list)
    _names: dict[int, str] = field(default_factory=dict)

    @classmethod
    def start(cls, workers: int = 1, timeout_s: float = 180.0, cpus: int = 2) -> LocalCluster:
        cluster = cls(temp_dir=tempfile.mkdtemp(prefix="ngr", dir="/tmp"), cpus=cpus)  # short: socket paths are limited
        (Path(cluster.temp_dir) / "ray_bootstrap_config.yaml").write_text("provider: {type: local}\n")
        try:
            for attempt in (1, 2):  # Ray gives a node 30 s to register, which a loaded machine can miss
                port = _free_port()
                cluster.address = f"{HEAD_IP}:{port}"
                head = cluster._node("head", ["--head", f"--port={port}", "--include-dashboard=false",
                                              f"--temp-dir={cluster.temp_dir}"], HEAD_IP)
                if cluster._started(head, "head", timeout_s):
                    break
                if attempt == 2 or "timed out during startup" not in cluster.log_tail("head"):
                    raise RuntimeError(f"the Ray head exited: {cluster.log_tail('head')}")
                cluster.nodes.remove(head)
            cluster.wait_nodes(1, timeout_s)  # a worker that joins a head still starting can time out
            for n in range(workers):
                cluster.add_worker(f"worker{n}")
            cluster.wait_nodes(1 + workers, timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def add_worker(self, name: str) -> subprocess.Popen:
        process = self._node(name, [f"--address={self.address}"], worker_ip(len(self.nodes) - 1))
        self._names[process.pid] = name
        return process

    def _node(self, name: str, args: list[str], ip: str) -> subprocess.Popen:
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", *args, f"--num-cpus={self.cpus}",
                   f"--node-ip-address={ip}", "--disable-usage-stats", "--block"]
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the node writes it until stopped
        env = {**os.environ, **cluster_env(), **node_env(self.temp_dir)}
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.nodes.append(process)
        return process

    def _started(self, process: subprocess.Popen, name: str, timeout_s: float) -> bool:
        """Whether the node says it started (True) or exits first (False), as a plain ``ray start`` returns."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "Ray runtime started" in self.log_tail(name, 200):
                return True
            if process.poll() is not None:
                return False
            time.sleep(0.2)
        raise TimeoutError(f"the Ray {name} did not start within {timeout_s:g} s: {self.log_tail(name)}")

    def wait_nodes(self, count: int, timeout_s: float = 120.0) -> None:
        """Wait until ``count`` nodes are alive (connects this process to the cluster)."""
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False)
        deadline = time.monotonic() + timeout_s
        retries = 2  # Ray gives a joining node 30 s to register, which a loaded machine can miss: start it again
        while sum(1 for node in ray.nodes() if node["Alive"]) < count:
            for process in [p for p in self.nodes[1:] if p.poll() is not None and p.pid in self._names]:
                if retries:
                    retries -= 1
                    self.nodes.remove(process)
                    self.add_worker(self._names.pop(process.pid) + "-again")
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {log.stem}:\n{self.log_tail(log.stem)}" for log in sorted(self.log_dir.glob("*.log")))
                raise TimeoutError(f"{count} Ray nodes not alive within {timeout_s:g} s\n{tails}")
            time.sleep(0.5)

    def kill_node(self, process: subprocess.Popen) -> None:
        """SIGKILL every process of a node at once, as a lost machine loses them (and the node stays dead).

        Its process group, and every descendant of its ``ray start`` process wherever it sits (Ray's
        workers and the servers they launched run in process groups and sessions of their own).
        """
        self._names.pop(process.pid, None)
        doomed = descendants(process.pid)
        _signal_group(process, signal.SIGKILL)
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        process.wait(30)

    def node_process(self, node_id: str) -> subprocess.Popen:
        """The ``ray start`` process of the node with this Ray node id."""
        import ray

        address = next(n["NodeManagerAddress"] + ":" + str(n["NodeManagerPort"]) for n in ray.nodes()
                       if n["NodeID"] == node_id)
        head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
        if node_id == head:
            return self.nodes[0]
        alive = [p for p in self.nodes[1:] if p.poll() is None]
        if len(alive) == 1:
            return alive[0]
        raise LookupError(f"cannot tell which worker process is node {node_id} ({address})")

    def replace_worker(self, process: subprocess.Popen, name: str = "worker-again") -> None:
        """After a kill: a new worker node in its place, and wait until the cluster has its nodes again."""
        self.nodes.remove(process)
        self.add_worker(name)
        self.wait_nodes(len(self.nodes), 180)

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop every node this cluster started: SIGTERM its group, SIGKILL what is left after 10 s."""
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:
            pass
        for process in reversed(self.nodes):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in reversed(self.nodes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(process, signal.SIGKILL)  # stragglers of the group (workers, agents)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.nodes.clear()
        for folder in (self.temp_dir, self.log_dir):  # Ray's session files and the nodes' logs
            if folder:
                shutil.rmtree(folder, ignore_errors=True)


def descendants(root: int) -> list[int]:
    """Every process whose chain of parents leads to ``root`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                parent = int(handle.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # the node's own session: only this cluster's processes
    except (ProcessLookupError, PermissionError):
        pass
