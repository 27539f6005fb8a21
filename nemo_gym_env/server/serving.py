"""The child side of the launcher: serve one resources server on the socket the launcher passed.

:func:`serve_server` runs in the server process (``python app.py`` -> ``run_webserver()``).
Under a launcher it reads :data:`~nemo_gym_env.system.child_env.SERVER_ENV`, serves on the
inherited listening socket, and watches a pipe whose EOF means the launcher is gone. With
``num_workers > 1``, uvicorn's supervisor spawns workers that rebuild the app through
:func:`worker_app` (sessions are then per worker: stateful servers need ``num_workers: 1``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import LaunchError
from nemo_gym_env.system.child_env import SERVER_ENV, SESSION_SECRET_ENV
from nemo_gym_env.system.net import DEFAULT_HOST, DEFAULT_PORT, http_url, is_loopback, listen_socket
from nemo_gym_env.system.processes import killpg

__all__ = ["PARENT_GONE_GRACE_S", "http_and_loop", "serve_server", "worker_app"]

PARENT_GONE_GRACE_S = 5.0
"""How long a server whose launcher is gone has to stop (SIGTERM) before it is killed."""

logger = logging.getLogger("nemo_gym_env.server.serving")


DEBUG_ENV = "NEMO_GYM_ENV_DEBUG"
"""Set (``nemo-gym-env --debug`` sets it for the servers it starts): a server that fails to start prints the traceback."""


def _one_line(name: str, exc: BaseException) -> str:
    """``NAME: cannot start: CAUSE`` on one line (what :class:`~nemo_gym_env.errors.ServerCrashed` reads)."""
    from pydantic import ValidationError

    from nemo_gym_env.errors import CANNOT_START

    if isinstance(exc, ValidationError):
        why = "invalid config: " + "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}"
                                             for e in exc.errors()[:5])
    else:
        why = " ".join(str(exc).split())
    return f"{name}{CANNOT_START}{why}"


def _built_or_exit(server_cls: type, config: dict[str, Any], name: str) -> Any:
    """The server's app; a failure the package names (a bad config, an MCP server that does not start, a module
    that does not import, a Ray cluster that cannot be joined) is one line, ``NAME: cannot start: ...``, and a
    non-zero exit: the traceback only with ``NEMO_GYM_ENV_DEBUG=1``. Failures at build time exit here (1);
    those of the app's start-up (its lifespan) are said the same way by the wrapper returned, and uvicorn
    exits (3) after its own one line."""
    from pydantic import ValidationError

    from nemo_gym_env.errors import NemoGymError

    try:
        app = server_cls.from_config(config, name).build_app()
    except (NemoGymError, ValidationError) as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        print(_one_line(name, exc), file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    return app if os.environ.get(DEBUG_ENV) else _StartupSaid(app, name)


class _Said(Exception):
    """A start-up failure already written as one line."""


class _StartupSaid:
    """The app, whose lifespan start-up failures the package names (:class:`NemoGymError`) are written as
    one line instead of the traceback Starlette hands uvicorn to log. Everything else passes through."""

    def __init__(self, app: Any, name: str):
        self.app, self.name = app, name
        inner = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(app_: Any) -> AsyncIterator[Any]:
            from nemo_gym_env.errors import NemoGymError

            async with contextlib.AsyncExitStack() as stack:
                try:
                    state = await stack.enter_async_context(inner(app_))
                except NemoGymError as exc:
                    print(_one_line(name, exc), file=sys.stderr, flush=True)
                    raise _Said from None
                yield state

        app.router.lifespan_context = lifespan

    def __getattr__(self, attribute: str) -> Any:  # app.state, app.routes ...: the app's own
        return getattr(self.app, attribute)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.startup.failed" and f"{__name__}._Said" in message.get("message", ""):
                message = {**message, "message": ""}  # said already; uvicorn adds "Application startup failed"
            await send(message)

        return await self.app(scope, receive, sending)


def http_and_loop(config: Mapping[str, Any]) -> tuple[str, str]:
    """The HTTP parser and event loop a server runs, from its (validated) config's ``http`` and ``loop``:
    ``auto`` resolved to what imports here (httptools, else h11; uvloop, else asyncio), so the log says
    which one serves. Defaults: ``http: auto``, ``loop: asyncio``."""
    http = str(config.get("http") or "auto")
    loop = str(config.get("loop") or "asyncio")
    if http == "auto":
        http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return http, loop


def serve_server(server_cls: type) -> None:
    """Serve ``server_cls`` in this process (called by ``SimpleResourcesServer.run_webserver()``).

    Under a :class:`Launcher`, reads what to serve from :data:`SERVER_ENV` and serves on the
    inherited socket. Run by hand (``python app.py host=0.0.0.0 port=9000 key=value ...``),
    binds ``host``/``port`` from the arguments (default 127.0.0.1:8000); other ``key=value``
    arguments become config keys.
    """
    import uvicorn

    raw = os.environ.get(SERVER_ENV)
    info = json.loads(raw) if raw else _info_from_argv(server_cls)
    config: dict[str, Any] = info["config"]
    name = info["name"]
    _configure_logging(config)
    if info.get("parent_fd") is not None:
        _watch_parent(int(info["parent_fd"]))
    host = str(config.get("host") or DEFAULT_HOST)
    if info.get("listen_fd") is not None:
        sock = socket.socket(fileno=int(info["listen_fd"]))
    else:
        sock = listen_socket(host, int(config.get("port") or DEFAULT_PORT))
    port = sock.getsockname()[1]
    if not is_loopback(host):
        logger.warning(
            "server %r listens on %s:%d, which is reachable from the network; its routes are "
            "unauthenticated (anyone who can connect can call every tool). Bind 127.0.0.1 unless you mean this.",
            name,
            host,
            port,
        )
    app = _built_or_exit(server_cls, config, name)  # fail here, before serving, on a bad config
    workers = int(config.get("num_workers") or 1)
    http, loop = http_and_loop(config)
    logger.info(
        "serving %s (%s) at %s with %d worker(s), http %s, loop %s",
        name, server_cls.__name__, http_url(host, port), workers, http, loop,
    )  # fmt: skip
    options: dict[str, Any] = {
        "http": http,
        "loop": loop,
        "log_level": str(config.get("log_level") or "info").lower(),
        "access_log": bool(config.get("access_log", False)),
        "timeout_graceful_shutdown": 1,
        "timeout_keep_alive": 30,
        "lifespan": "on",
    }
    if workers <= 1:
        # Subprocesses of the server (tool sandboxes, ...) must not inherit the secret or the config.
        os.environ.pop(SESSION_SECRET_ENV, None)
        os.environ.pop(SERVER_ENV, None)
        uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=[sock])
        return
    # Spawned workers rebuild the app of this very class from the entrypoint file and share the
    # session secret.
    os.environ[SERVER_ENV] = json.dumps({**info, "listen_fd": None, "parent_fd": None,
                                         "server_class": server_cls.__name__})
    os.environ.setdefault(SESSION_SECRET_ENV, secrets.token_urlsafe(32))
    del app
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:  # uvicorn >= 0.37
        # uvicorn kills a worker that has not answered its health check within this many seconds,
        # and a worker answers only once it has imported the server (spawned: every import anew).
        # Its default of 5 s is shorter than that import on a loaded 2-core machine, where the
        # supervisor would kill and respawn workers forever and the server never came up.
        options["timeout_worker_healthcheck"] = int(config.get("worker_healthcheck_timeout_s") or 60)
    uv_config = uvicorn.Config(f"{__name__}:worker_app", factory=True, workers=workers, **options)
    from uvicorn.supervisors import Multiprocess

    if "target" in inspect.signature(Multiprocess).parameters:  # uvicorn < 0.30
        server = uvicorn.Server(uv_config)
        Multiprocess(uv_config, target=server.run, sockets=[sock]).run()
    else:
        Multiprocess(uv_config, sockets=[sock]).run()


def worker_app() -> Any:
    """App factory of one worker when ``num_workers > 1`` (imported by uvicorn by name)."""
    info = json.loads(os.environ[SERVER_ENV])
    _configure_logging(info["config"])
    cls = _load_server_class(Path(info["entrypoint"]), info["server_class"])
    app = cls.from_config(info["config"], info["name"]).build_app()
    os.environ.pop(SESSION_SECRET_ENV, None)  # as in serve(): not for the worker's own subprocesses
    os.environ.pop(SERVER_ENV, None)
    return app if os.environ.get(DEBUG_ENV) else _StartupSaid(app, info["name"])


def _load_server_class(path: Path, class_name: str) -> type:
    """Import the entrypoint ``path`` under a unique module name; return its class ``class_name``."""
    module_name = f"_nemo_gym_env_entry_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    module = sys.modules.get(module_name)
    if module is None:
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise LaunchError(f"cannot import the server entrypoint {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # pydantic resolves annotations through sys.modules
        spec.loader.exec_module(module)
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and hasattr(cls, "from_config")):
        raise LaunchError(f"{path} has no server class named {class_name!r}")
    return cls


def _info_from_argv(server_cls: type) -> dict[str, Any]:
    import yaml

    config: dict[str, Any] = {}
    for arg in sys.argv[1:]:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or not key:
            raise SystemExit(f"unexpected argument {arg!r}; use key=value (e.g. host=127.0.0.1 port=8000)")
        config[key] = yaml.safe_load(value) if value else ""
    config.setdefault("host", DEFAULT_HOST)
    config.setdefault("port", DEFAULT_PORT)
    name = str(config.pop("name", server_cls.__name__))
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    entrypoint = str(Path(main_file).resolve()) if main_file else ""
    return {"name": name, "config": config, "listen_fd": None, "parent_fd": None, "entrypoint": entrypoint}


def _configure_logging(config: Mapping[str, Any]) -> None:
    level = str(config.get("log_level") or "info").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(levelname)s:     [%(name)s] %(message)s",
        stream=sys.stderr,
    )


def _signal_own_group(sig: int) -> None:
    if os.getpgrp() == os.getpid():  # started by a Launcher: the group is this server and its workers
        killpg(os.getpgrp(), sig)
    else:
        os.kill(os.getpid(), sig)


def _watch_parent(fd: int) -> None:
    """Shut down when the launcher process goes away (EOF on a pipe only it can write)."""

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        logger.warning("the launcher process is gone; shutting down")
        _signal_own_group(signal.SIGTERM)
        time.sleep(PARENT_GONE_GRACE_S)
        _signal_own_group(signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="nemo-gym-env-parent-watch", daemon=True).start()
