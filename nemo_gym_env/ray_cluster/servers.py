"""``RayLauncher``: resources servers placed on Ray cluster nodes, with the ``Launcher`` surface.

Each server gets a small Ray actor on some node (the nodes taken in turn by default, or
pinned to one). The actor runs a :class:`~nemo_gym_env.launch.launcher.Launcher` there, which serves the
server as a uvicorn process on the node's address exactly as a local launch does
(``serving.serve_server`` -> the class's ``from_config`` + ``build_app``; signed sessions, a
fresh secret per server, readiness, restarts, a log file) and reports its URL back::

    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.ray_cluster import RayLauncher

    with RayLauncher(address="10.0.0.1:6379") as launcher:
        for server in launcher.start_all([bundled_spec("math"), bundled_spec("mcqa")]):
            print(server.name, server.url, server.node_id)

Why a process per server rather than uvicorn inside the actor: the server keeps its own GIL,
``num_workers`` and verifier process pools work as they do locally, and the launcher's
guarantees hold. A server outlives no actor: the actor's death (``ray.kill``, a lost node)
closes the pipe its server watches, and the server stops itself.

Every server gets the cluster's address as ``ray_head_node_address`` (NeMo Gym's global key)
unless its config sets one, so servers with a Ray path (``math``) verify with Ray tasks, in CPUs
they reserve when they start (:class:`~nemo_gym_env.server.workers.RayRunner`).

Resources: each server's actor holds the CPUs of the server's own processes (its
``num_workers``, 1 by default; ``num_cpus=`` to change), so rollout workers started afterwards
take only what is left, and a server that cannot be placed fails at start with the numbers.

A lost node: a watcher thread checks every server each ``watch_interval_s`` (``GET /``, and its
actor when that fails); a server whose node is gone is started again, with its spec, on a live
node, and its :class:`RayServer` record takes the new address (``url``, ``node_id``, ``pid``...).
:attr:`RayLauncher.urls`, the head server, ``ray_collect`` and ``RayVectorEnv`` given the
launcher follow it; episodes that were in flight on the lost server fail with the reason.
:attr:`RayLauncher.replacements` says what moved, where, and how long it took.

The default host is the node's IP address, reachable from the other nodes (the launcher logs
that such a server's routes are unauthenticated); pass ``host="127.0.0.1"`` for a one-machine
cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.errors import ClusterCapacityError, LaunchError
from nemo_gym_env.launch.config import ServerSpec
from nemo_gym_env.launch.launcher import StartedServer
from nemo_gym_env.ray_cluster.capacity import free_per_node, require, track
from nemo_gym_env.ray_cluster.connection import (
    RAY_ADDRESS_KEY,
    connect,
    import_ray,
    kill_actor,
    remote_class,
    remote_message,
)
from nemo_gym_env.system.closing import Closing

__all__ = ["RayLauncher", "RayServer"]

logger = logging.getLogger("nemo_gym_env.ray_cluster")


class _ServerHost:
    """The per-server actor: a Launcher on its node (wrapped by ``ray.remote`` on first use)."""

    def __init__(self, ready_timeout_s: float, auto_restart: bool):
        from nemo_gym_env.launch.launcher import Launcher

        self._launcher = Launcher(ready_timeout_s=ready_timeout_s, auto_restart=auto_restart)
        self._name: str | None = None

    def start(self, spec: ServerSpec, host: str | None, port: int | None) -> dict[str, Any]:
        import ray

        host = host or ray.util.get_node_ip_address()
        try:
            proc = self._launcher.start(spec, host=host, port=port)
        except LaunchError as exc:  # ServerCrashed's arguments do not survive Ray's pickling: keep the message
            raise LaunchError(str(exc)) from None
        self._name = proc.name
        return {"host": proc.host, "port": proc.port, "url": proc.url, "pid": proc.pid,
                "log_path": str(proc.log_path), "node_id": ray.get_runtime_context().get_node_id()}

    def status(self) -> dict[str, Any]:
        proc = self._launcher.servers.get(self._name or "")
        if proc is None:
            return {"status": "stopped", "restarts": 0, "pid": 0}
        return {"status": proc.status, "restarts": proc.restarts, "pid": proc.pid}

    def log_tail(self, lines: int) -> str:
        proc = self._launcher.servers.get(self._name or "")
        return "" if proc is None else proc.log_tail(lines)

    def restart(self) -> dict[str, Any]:
        proc = self._launcher.restart(self._name or "")
        return {"pid": proc.pid, "restarts": proc.restarts}

    def stop(self) -> None:
        self._launcher.close()


@dataclass(eq=False)
class RayServer(StartedServer):
    """One server placed on the cluster; the attributes of :class:`~nemo_gym_env.launch.launcher.ServerProcess`.

    Attributes:
        name: The instance name.
        spec: The spec it was started from (with ``ray_head_node_address`` filled in).
        host: The address it listens on (its node's).
        port: Its port.
        url: ``http://host:port``.
        pid: Its process id on its node.
        node_id: The Ray node it runs on.
        log_path: Its log file, on its node.
        num_cpus: The CPUs its actor holds for it.
        restarts: Restarts so far (as of the last :meth:`RayLauncher.refresh`).
        replaced: How many times it was started again on another node (its node was lost).
    """

    node_id: str
    log_path: str
    num_cpus: float = 0.0
    restarts: int = 0
    replaced: int = 0
    _status: str = field(default="running", repr=False)
    _actor: Any = field(default=None, repr=False)
    _bind: tuple[str | None, int | None] = field(default=(None, None), repr=False)  # (host, port) as asked

    @property
    def status(self) -> str:
        """``running``, ``exited``, ``failed`` or ``stopped``, as of the last :meth:`RayLauncher.refresh`."""
        return self._status

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of its log (read on its node; credentials masked)."""
        import ray

        return ray.get(self._actor.log_tail.remote(lines), timeout=30)


class RayLauncher(Closing):
    """Starts resources servers on Ray cluster nodes; the surface of :class:`~nemo_gym_env.launch.launcher.Launcher`.

    Args:
        address: The cluster (see :func:`~nemo_gym_env.ray_cluster.connect`); None joins the one
            this process is connected to, ``RAY_ADDRESS``, or ``ray.init()``'s default.
        host: Address the servers bind on their nodes; default: each node's IP address.
        num_cpus: CPUs each server's actor holds for the server's processes; default: the
            server's ``num_workers`` (1 when unset). 0 makes servers invisible to Ray's
            accounting (workers and tasks may then crowd their node).
        strategy: Where servers go: ``"round_robin"`` (default: the alive nodes in turn, by
            node id, skipping nodes without the free CPUs), or any Ray scheduling
            strategy for the server actors (``"SPREAD"``, ``"DEFAULT"``, a strategy object).
        ready_timeout_s: How long a server may take to answer ``GET /``.
        auto_restart: Restart a server that exits, on the same node and port.
        call_timeout_s: Timeout of each call to a server's actor.
        replace_lost: Start a server again on a live node when its node is lost.
        watch_interval_s: How often the watcher checks each server.
        on_replaced: Called with each record of :attr:`replacements` as it happens (on the
            watcher's thread).
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        host: str | None = None,
        num_cpus: float | None = None,
        strategy: Any = "round_robin",
        ready_timeout_s: float = 120.0,
        auto_restart: bool = True,
        call_timeout_s: float = 180.0,
        replace_lost: bool = True,
        watch_interval_s: float = 1.0,
        on_replaced: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.gcs_address = connect(address)
        self.host = host
        self.num_cpus = num_cpus
        self.strategy = strategy
        self.ready_timeout_s = ready_timeout_s
        self.auto_restart = auto_restart
        self.call_timeout_s = call_timeout_s
        self.replace_lost = replace_lost
        self.watch_interval_s = watch_interval_s
        self.on_replaced = on_replaced
        self.replacements: list[dict[str, Any]] = []
        """One record per server started again elsewhere: ``name``, ``reason``, ``from_node``,
        ``to_node``, ``from_url``, ``to_url``, ``replace_s`` (from the failed check to serving again)."""
        self._servers: dict[str, RayServer] = {}
        self._closed = False
        self._turn = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        track(self)

    # ---- the Launcher surface ----------------------------------------------------------------

    @property
    def servers(self) -> dict[str, RayServer]:
        """The servers started and not stopped, by instance name (a copy)."""
        with self._lock:
            return dict(self._servers)

    @property
    def urls(self) -> dict[str, str]:
        """Each server's current base URL, by instance name (it changes when a server is re-placed)."""
        with self._lock:
            return {name: server.url for name, server in self._servers.items()}

    def start(self, spec: ServerSpec, *, host: str | None = None, port: int | None = None,
              node_id: str | None = None) -> RayServer:
        """Start one server on the cluster and wait until it answers ``GET /``.

        Args:
            spec: The server to start.
            host: Address to bind on its node (default: the launcher's ``host``, else the node's IP).
            port: Port to bind (default: the spec's, else a free one).
            node_id: Pin it to this Ray node (default: placed by ``strategy``).

        Raises:
            LaunchError: It could not be started (the message carries its log tail).
        """
        return self.start_all([spec], host=host, port=port, node_id=node_id)[0]

    def start_all(self, specs: Iterable[ServerSpec], *, host: str | None = None, port: int | None = None,
                  node_id: str | None = None) -> list[RayServer]:
        """Start several servers in parallel; if any fails, those started by this call are stopped."""
        ray = import_ray()
        if self._closed:
            raise LaunchError("this RayLauncher is closed; create a new one")
        specs = [self._with_address(spec) for spec in specs]
        for spec in specs:
            if spec.instance_name in self._servers:
                raise LaunchError(f"server {spec.instance_name!r} is already running at "
                                  f"{self._servers[spec.instance_name].url}; stop it first")
        cpus = [self._cpus(spec) for spec in specs]
        try:
            require(f"RayLauncher: {len(specs)} server(s) ({', '.join(s.instance_name for s in specs)})",
                    [(c, 0.0) for c in cpus], wait_s=10.0)
        except ClusterCapacityError as exc:
            raise LaunchError(str(exc)) from None
        bind = (host or self.host, port)
        actors = [self._actor(node_id, c) for c in cpus]
        calls = [a.start.remote(s, *bind) for a, s in zip(actors, specs)]
        started: list[RayServer] = []
        try:
            for actor, spec, call, c in zip(actors, specs, calls, cpus):
                info = self._started(ray, spec, call)
                started.append(RayServer(spec.instance_name, spec, info["host"], info["port"], info["url"],
                                         info["pid"], info["node_id"], info["log_path"], num_cpus=c, _actor=actor,
                                         _bind=bind))
        except BaseException:
            for actor in actors:
                kill_actor(ray, actor)
            raise
        with self._lock:
            for server in started:
                self._servers[server.name] = server
                logger.info("server %r on node %s at %s", server.name, server.node_id[:12], server.url)
        if self.replace_lost and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="RayLauncher watcher", daemon=True)
            self._watcher.start()
        return started

    def _started(self, ray: Any, spec: ServerSpec, call: Any) -> dict[str, Any]:
        try:
            return ray.get(call, timeout=self.ready_timeout_s + 60)
        except Exception as exc:  # noqa: BLE001 - any failure of the remote start is a LaunchError
            raise LaunchError(f"server {spec.instance_name!r} could not be started on the Ray cluster: "
                              f"{remote_message(exc)}") from None

    def restart(self, name: str) -> RayServer:
        """Restart a server on its node and port."""
        ray = import_ray()
        server = self._get(name)
        info = ray.get(server._actor.restart.remote(), timeout=self.ready_timeout_s + 60)
        server.pid, server.restarts, server._status = info["pid"], info["restarts"], "running"
        return server

    def refresh(self) -> dict[str, RayServer]:
        """Ask every server's actor how its server is doing; a lost actor (its node died) reads ``failed``."""
        ray = import_ray()
        for server in self._servers.values():
            try:
                info = ray.get(server._actor.status.remote(), timeout=self.call_timeout_s)
            except Exception:  # noqa: BLE001 - a dead actor or node
                server._status = "failed"
                continue
            server._status, server.restarts, server.pid = info["status"], info["restarts"], info["pid"] or server.pid
        return self.servers

    def stop(self, name: str | None = None, timeout_s: float = 10.0) -> None:
        """Stop one server (``name``) or all; their actors go with them.

        Raises:
            KeyError: ``name`` is not a server of this launcher.
        """
        ray = import_ray()
        with self._lock:
            if name is None:
                servers = list(self._servers.values())
                self._servers.clear()
            else:
                if name not in self._servers:
                    raise KeyError(f"no server named {name!r} in this RayLauncher; running: "
                                   f"{sorted(self._servers) or 'none'}")
                servers = [self._servers.pop(name)]
        stops = [s._actor.stop.remote() for s in servers]
        try:
            ray.wait(stops, num_returns=len(stops), timeout=timeout_s)
        finally:
            for server in servers:
                server._status = "stopped"
                kill_actor(ray, server._actor)

    def close(self) -> None:
        """Stop the watcher and every server; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._stop.set()
            if self._watcher is not None:
                self._watcher.join(self.ready_timeout_s + 90)
            if self._servers:
                self.stop()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    def __repr__(self) -> str:
        return f"RayLauncher(servers={sorted(self._servers)}, cluster={self.gcs_address!r})"

    # ---- internals -------------------------------------------------------------------------

    def _get(self, name: str) -> RayServer:
        if name not in self._servers:
            raise LaunchError(f"no server named {name!r} in this RayLauncher; running: {sorted(self._servers) or 'none'}")
        return self._servers[name]

    def _with_address(self, spec: ServerSpec) -> ServerSpec:
        if spec.server_type != "resources_servers" or spec.config.get(RAY_ADDRESS_KEY):
            return spec
        return replace(spec, config={**spec.config, RAY_ADDRESS_KEY: self.gcs_address})

    def _cpus(self, spec: ServerSpec) -> float:
        if self.num_cpus is not None:
            return float(self.num_cpus)
        return float(max(1, int(spec.config.get("num_workers") or 1)))

    def _actor(self, node_id: str | None, cpus: float, avoid: str | None = None) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = self.strategy
        if node_id is not None:
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        elif strategy == "round_robin" or avoid is not None:
            # Ray's SPREAD (and soft node affinity) is best effort and stacked zero-CPU actors in our
            # tests: pin each server to the next alive node that has the CPUs free.
            nodes = sorted(n["NodeID"] for n in import_ray().nodes() if n["Alive"] and n["NodeID"] != avoid)
            if not nodes:
                raise LaunchError("no live Ray node to place the server on")
            free = free_per_node()
            fitting = [n for n in nodes if free.get(n, {}).get("CPU", 0.0) + 1e-9 >= cpus] or nodes
            strategy = NodeAffinitySchedulingStrategy(node_id=fitting[self._turn % len(fitting)], soft=False)
            self._turn += 1
        return remote_class(_ServerHost).options(num_cpus=cpus, scheduling_strategy=strategy,
                                     max_restarts=0).remote(self.ready_timeout_s, self.auto_restart)

    # ---- lost nodes ------------------------------------------------------------------------

    def _watch(self) -> None:
        """The watcher thread: a server that fails two checks in a row is started again elsewhere."""
        strikes: dict[str, int] = {}
        while not self._stop.wait(self.watch_interval_s):
            for server in self.servers.values():
                if self._stop.is_set():
                    return
                if self._alive(server):
                    strikes.pop(server.name, None)
                    continue
                strikes[server.name] = strikes.get(server.name, 0) + 1
                if strikes[server.name] >= 2:
                    try:
                        self._replace(server, f"{server.url} stopped answering and its Ray actor is gone")
                        strikes.pop(server.name, None)
                    except Exception:  # logged; the next round tries again
                        logger.exception("could not place server %r again", server.name)

    def _alive(self, server: RayServer) -> bool:
        """Its ``GET /`` answers, or (restarting on its node) its actor does."""
        if background_loop().run(ResourcesClient(server.url, timeout_s=3.0).health(timeout_s=3.0), timeout=10):
            return True
        ray = import_ray()
        try:
            ray.get(server._actor.status.remote(), timeout=3.0)
        except Exception:  # noqa: BLE001 - a dead actor, a lost node, or no answer in time
            return False
        return True

    def _replace(self, server: RayServer, reason: str) -> None:
        """Start ``server`` again, with its spec, on another live node; its record takes the new address."""
        ray = import_ray()
        began = time.monotonic()
        logger.warning("server %r on node %s is lost (%s); placing it again", server.name, server.node_id[:12], reason)
        kill_actor(ray, server._actor)
        actor = self._actor(None, server.num_cpus, avoid=server.node_id)
        try:
            info = self._started(ray, server.spec, actor.start.remote(server.spec, *server._bind))
        except BaseException:
            kill_actor(ray, actor)
            raise
        record = {"name": server.name, "reason": reason, "from_node": server.node_id, "to_node": info["node_id"],
                  "from_url": server.url, "to_url": info["url"], "replace_s": round(time.monotonic() - began, 3)}
        with self._lock:
            if self._servers.get(server.name) is not server or self._closed:  # stopped meanwhile
                kill_actor(ray, actor)
                return
            server.host, server.port, server.url, server.pid = info["host"], info["port"], info["url"], info["pid"]
            server.node_id, server.log_path, server._actor = info["node_id"], info["log_path"], actor
            server.restarts, server.replaced, server._status = 0, server.replaced + 1, "running"
            self.replacements.append(record)
        logger.warning("server %r placed again on node %s at %s in %.1f s", server.name, server.node_id[:12],
                       server.url, record["replace_s"])
        if self.on_replaced is not None:
            self.on_replaced(record)
