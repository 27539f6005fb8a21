"""Where servers are: the one :class:`ServerSet` every entry point takes its servers from, and an env's
server (:func:`resolve_server`: a URL, a config, or a bundled server started on loopback, shared).

Light on purpose (no openai, no pydantic models): ``gym.make`` resolves the server through this
module, and spawns an embedded one, before it imports the env's own modules, so that the
server's start-up and those imports overlap (see :mod:`nemo_gym_env.envs.make`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_env.bridge.targets import check_hosted, is_hosted, is_target, target_config
from nemo_gym_env.errors import UsageError
from nemo_gym_env.launch.catalog import bundled_config_path, bundled_servers
from nemo_gym_env.launch.config import ServerSpec, agent_routes, load_config, server_specs
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.launch.shared import acquire_server, release_server
from nemo_gym_env.system.closing import Closing

__all__ = ["Server", "ServerHandle", "ServerSet", "merged_config", "resolve_server"]


@dataclass
class ServerHandle:
    """Where an env's server is, and whether the env holds a shared embedded server."""

    url: str
    name: str
    default_dataset: Path | list[dict[str, Any]] | None
    """The rows an env plays when it is given none: a bundled server's example file, a hosted env's seeds."""
    acquired: str | None

    def release(self) -> None:
        """Give back the shared embedded server, if this handle holds one (idempotent)."""
        if self.acquired is not None:
            release_server(self.acquired)
            self.acquired = None


def resolve_server(
    server: str | None,
    base_url: str | None,
    config_paths: Sequence[str] | None,
    *,
    while_starting: Callable[[], object] | None = None,
    hosted: dict[str, Any] | None = None,
    num_tasks: int = 1000,
) -> ServerHandle:
    """Find or start the server an env talks to: a URL, a config, a bundled name or a hosted env.

    ``server`` may be ``gymnasium:ENV_ID`` or ``textarena:GAME`` (:mod:`~nemo_gym_env.bridge.targets`),
    with ``hosted`` more keys of its config; its tasks are then ``num_tasks`` rows, one per seed
    from 0. For a bundled name or a config, ``hosted`` (``gym.make``'s ``server_config``) overrides keys
    of the server's config, in a server of its own (the plain one stays shared). ``while_starting``
    runs while a server this call starts boots (see :func:`~nemo_gym_env.launch.shared.acquire_server`).
    The server is found by :meth:`ServerSet.launching`, as every other entry point finds its servers,
    and shared through :func:`~nemo_gym_env.launch.shared.acquire_server`.
    """
    target = base_url is None and server is not None and is_target(server)
    if base_url is not None:
        return ServerHandle(base_url.rstrip("/"), server or base_url, None, None)
    if config_paths:
        found = [s for s in ServerSet.launching(config_paths=config_paths, check=False)
                 if server is None or server in (s.name, s.spec.impl_name)]
        if len(found) != 1:
            raise ValueError(f"config_paths define {len(found)} matching resources servers; name one with server=...")
    elif server is not None:
        found = list(ServerSet.launching([server], check=False))
    else:
        raise ValueError("give a bundled server name, a base_url, or config_paths")
    chosen = found[0]
    spec = chosen.spec
    if hosted:  # its own server: the shared server of the plain one must not serve this variant
        spec = dataclasses.replace(spec, instance_name=_variant(spec.instance_name, hosted),
                                   config={**spec.config, **hosted})
    if target:
        from nemo_gym_env.bridge.datasets import example_rows

        check_hosted(spec.instance_name, spec.config)
        default: Path | list[dict[str, Any]] | None = example_rows(spec.config, num_tasks)
    else:
        default = chosen.examples
    process = acquire_server(spec, while_starting=while_starting)
    return ServerHandle(process.url, spec.instance_name, default, spec.instance_name)


def _variant(instance: str, settings: dict[str, Any]) -> str:
    """The instance name of a server started with ``settings`` over its config (its own shared server)."""
    return instance + "_" + hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:8]


# ---- the server set --------------------------------------------------------------------------------


@dataclass
class Server:
    """One server of a :class:`ServerSet`: where it answers, or how to start it."""

    name: str
    url: str | None = None
    """Its base URL; None until the set starts it."""
    spec: ServerSpec | None = None
    """How to start it (None for a server already running)."""
    bundled: str | None = None
    """The bundled (or installed plugin) server it is: its scripted player, its example data; None otherwise."""

    @property
    def config(self) -> dict[str, Any]:
        """Its config block (empty for a server known only by its URL)."""
        return self.spec.config if self.spec is not None else {}

    @property
    def examples(self) -> Path | None:
        """Its example tasks, ``data/example.jsonl`` of its folder (a bundled or installed server's, or the folder
        holding the ``configs/`` its config came from); None when there is none."""
        if self.bundled is not None:
            folder: Path | None = bundled_servers()[self.bundled]
        elif self.spec is not None and self.spec.config_dir is not None:
            folder = Path(self.spec.config_dir)
            folder = folder.parent if folder.name == "configs" else folder
        else:
            folder = None
        path = folder / "data" / "example.jsonl" if folder is not None else None
        return path if path is not None and path.is_file() else None


class ServerSet(Closing):
    """The servers an entry point uses, however the user named them; starts those it must, stops them again.

    Every way to name servers turns into one here: bundled and installed servers' names,
    ``gymnasium:ENV_ID`` / ``textarena:GAME`` targets, server folders (``./my_env``, as ``nemo-gym-env init``
    writes one), NeMo Gym config paths and Hydra overrides
    (:meth:`launching`); a URL per server, one ``--server-url``, a head server's list (:meth:`running`);
    and :meth:`of`, the command line's rule (running servers when a URL is given, else launched ones).
    ``gym.make``, ``rollouts``, ``reverify``, ``serve``, ``check``, NeMo RL's producer and the TRL recipe
    take their servers from here::

        with ServerSet.launching(["example_multi_step"]) as servers:
            urls = servers.start()          # {"example_multi_step": "http://127.0.0.1:..."}

    :meth:`start` runs the servers under a :class:`~nemo_gym_env.launch.launcher.Launcher`, or under any
    launcher with its surface (``start_all``, ``close``): a :class:`~nemo_gym_env.ray_cluster.RayLauncher`
    places them on a Ray cluster.
    """

    def __init__(self, servers: Iterable[Server] = (), cfg: Any = None):
        self.servers: dict[str, Server] = {server.name: server for server in servers}
        self.cfg = cfg
        """The merged config the launched servers came from (None for running servers only)."""
        self.launcher: Any = None
        """What :meth:`start` started them with, until :meth:`close`."""

    # ---- the ways to name servers ----------------------------------------------------------------

    @classmethod
    def launching(cls, names: Iterable[str] = (), overrides: Iterable[str] = (), *, env_yaml: str | Path | None = None,
                  config_paths: Iterable[str | Path] = (), server_config: Mapping[str, Mapping[str, Any]] | None = None,
                  check: bool = True) -> ServerSet:
        """Servers to start: bundled or installed names, hosted targets, ``config_paths`` and Hydra ``overrides``.

        ``server_config`` maps an instance name to keys over its config block. A hosted env is built
        here once (:func:`~nemo_gym_env.bridge.targets.check_hosted`), so a wrong id fails now, in one line
        (``check=False``: not here; ``gym.make`` starts its server first and checks while it boots).

        Raises:
            UnknownServerError: a name is neither bundled nor installed nor a target.
            ConfigError: a config or a hosted target is wrong.
        """
        cfg = merged_config(names, overrides, env_yaml, config_paths)
        servers = []
        for spec in server_specs(cfg):
            extra = (server_config or {}).get(spec.instance_name)
            if extra:
                spec = dataclasses.replace(spec, config={**spec.config, **extra})
            if check and is_hosted(spec):
                check_hosted(spec.instance_name, spec.config)
            servers.append(Server(spec.instance_name, spec=spec, bundled=_bundled_name(spec)))
        return cls(servers, cfg)

    @classmethod
    def running(cls, urls: Mapping[str, str] | None = None, *, head_url: str | None = None,
                names: Iterable[str] = ()) -> ServerSet:
        """Servers already up: ``urls`` by name, and a head server's (``GET /servers``), ``names`` of them if given.

        Raises:
            UsageError: the head server has none of ``names``, or no server at all.
        """
        found = {name: str(url).rstrip("/") for name, url in (urls or {}).items()}
        names = list(names)
        if head_url:
            from nemo_gym_env.client.head_client import fetch_servers

            listed = fetch_servers(head_url)
            unknown = [n for n in names if n not in listed]
            if unknown:
                raise UsageError(f"the head server at {head_url} has no server {unknown[0]!r}; it has: {', '.join(listed)}")
            if not listed:
                raise UsageError(f"the head server at {head_url} reports no servers")
            found.update({n: listed[n] for n in names} if names else listed)
        bundled = bundled_servers()
        return cls(Server(name, url=url, bundled=name if name in bundled else None) for name, url in found.items())

    @classmethod
    def of(cls, names: Iterable[str] = (), overrides: Iterable[str] = (), *, env_yaml: str | Path | None = None,
           server_url: str | None = None, head_url: str | None = None) -> ServerSet:
        """The command line's servers: one ``server_url`` (named by the one name given, else ``server``), a head
        server's (``names`` choose among them), or else :meth:`launching` ``names`` with ``overrides``.

        Raises:
            UsageError: both URLs, or ``server_url`` with several names.
        """
        names = list(dict.fromkeys(names))
        if server_url and head_url:
            raise UsageError("give --head-url or --server-url, not both")
        if server_url:
            if len(names) > 1:
                raise UsageError("--server-url is one server; name at most one with --server")
            return cls.running({names[0] if names else "server": server_url})
        if head_url:
            return cls.running(head_url=head_url, names=names)
        return cls.launching(names, overrides, env_yaml=env_yaml)

    def __or__(self, other: ServerSet) -> ServerSet:
        """Both sets' servers (``other``'s where a name is in both)."""
        return ServerSet([*self.servers.values(), *other.servers.values()], other.cfg if other.cfg is not None else self.cfg)

    # ---- what the set knows ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Server]:
        return iter(list(self.servers.values()))

    def __len__(self) -> int:
        return len(self.servers)

    def __getitem__(self, name: str) -> Server:
        return self.servers[name]

    def __contains__(self, name: object) -> bool:
        return name in self.servers

    @property
    def names(self) -> list[str]:
        """Every server's name, in order."""
        return list(self.servers)

    @property
    def urls(self) -> dict[str, str]:
        """Name -> base URL of every server that has one (running, or started by :meth:`start`)."""
        return {s.name: s.url for s in self.servers.values() if s.url is not None}

    @property
    def routes(self) -> dict[str, str]:
        """NeMo Gym agent name -> resources server, from the merged config (rows name their agent)."""
        return agent_routes(self.cfg) if self.cfg is not None else {}

    def protocols(self, timeout_s: float = 10.0) -> dict[str, str]:
        """Name -> ``"resources"`` or ``"gymnasium"`` of every server with a URL, asked of the servers themselves
        (:mod:`~nemo_gym_env.envs.traits`); a server that does not answer is left out."""
        import asyncio

        from nemo_gym_env.client.resources import ResourcesClient
        from nemo_gym_env.envs.traits import server_traits

        async def ask() -> dict[str, str]:
            clients = {n: ResourcesClient(u, timeout_s=timeout_s) for n, u in self.urls.items()}
            traits = await asyncio.gather(*(server_traits(c) for c in clients.values()), return_exceptions=True)
            return {n: t.protocol for n, t in zip(clients, traits) if not isinstance(t, BaseException)}

        return asyncio.run(ask())

    # ---- starting and stopping ---------------------------------------------------------------------

    def start(self, only: Iterable[str] | None = None, *, launcher: Any = None, **launcher_options: Any) -> dict[str, str]:
        """Start every server of the set that is not running (those of ``only``, if given) and wait for them.

        ``launcher``: what starts them (a :class:`~nemo_gym_env.ray_cluster.RayLauncher`, ...); by default a
        :class:`~nemo_gym_env.launch.launcher.Launcher` made with ``launcher_options`` (``log_dir``,
        ``stream_logs``; ``auto_restart`` is on unless given). :meth:`close` stops them. Returns :attr:`urls`.
        """
        wanted = set(self.servers if only is None else only)
        specs = [s.spec for s in self.servers.values() if s.name in wanted and s.url is None and s.spec is not None]
        if specs:
            if self.launcher is None:
                self.launcher = launcher if launcher is not None else Launcher(
                    **{"auto_restart": True, **launcher_options})
            for process in self.launcher.start_all(specs):
                self.servers[process.name].url = process.url
        return self.urls

    def close(self) -> None:
        """Stop what :meth:`start` started (idempotent); servers that were running stay up."""
        launcher, self.launcher = self.launcher, None
        if launcher is not None:
            launcher.close()
            for server in self.servers.values():
                if server.spec is not None:
                    server.url = None

    def __repr__(self) -> str:
        return "ServerSet(" + ", ".join(f"{s.name}={s.url or 'not started'}" for s in self.servers.values()) + ")"


def merged_config(names: Iterable[str] = (), overrides: Iterable[str] = (), env_yaml: str | Path | None = None,
                  config_paths: Iterable[str | Path] = ()) -> Any:
    """The merged NeMo Gym config of server ``names`` (bundled or installed names, hosted targets, server
    folders), ``config_paths`` and Hydra ``overrides`` (and ``env_yaml``)."""
    names = list(names)
    hosted = [n for n in names if is_target(n)]
    base = {key: value for n in hosted for key, value in target_config(n).items()}
    paths = [_config_path(n) for n in names if n not in hosted] + list(config_paths)
    return load_config(paths, list(overrides), env_yaml=env_yaml, base=base or None)


def _config_path(name: str) -> Path:
    """The config a server's name stands for: a bundled or installed server's own, or a server folder's
    (``nemo-gym-env init``'s layout, ``FOLDER/configs/FOLDER.yaml``) when the name is a path to one."""
    folder = Path(name).expanduser()
    own = folder / "configs" / f"{folder.resolve().name}.yaml"
    if name not in bundled_servers() and own.is_file():
        return own.resolve()
    return bundled_config_path(name)


def _bundled_name(spec: ServerSpec) -> str | None:
    bundled = bundled_servers()
    return next((n for n in (spec.instance_name, spec.impl_name) if n in bundled), None)
