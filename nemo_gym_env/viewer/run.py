"""``nemo-gym-env view`` and ``nemo-gym-env play``: bind, print the URL, serve until Ctrl-C or SIGTERM.

Example:
    >>> run_view(["results/rollouts.jsonl"], port=8080)                              # doctest: +SKIP
    nemo-gym-env view: http://127.0.0.1:8080/
    >>> run_play(EnvSpec("NemoGym/example_multi_step-v0"), output="results/played.jsonl")  # doctest: +SKIP
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from nemo_gym_env.errors import ConfigError, LaunchError
from nemo_gym_env.system.net import http_url, is_loopback, listen_socket
from nemo_gym_env.system.redaction import SECRET_KEY_PATTERN
from nemo_gym_env.viewer.index import DEFAULT_MAX_ROW_BYTES
from nemo_gym_env.viewer.library import RolloutLibrary
from nemo_gym_env.viewer.play_app import EnvSpec, PlaySessions, create_play_app
from nemo_gym_env.viewer.rows import Scrubber
from nemo_gym_env.viewer.view_app import create_view_app

__all__ = ["env_yaml_secrets", "run_play", "run_view"]

PROG = "nemo-gym-env"

LOOPBACK = "127.0.0.1"
"""Where the pages listen unless told otherwise: only this machine can open them."""


def env_yaml_secrets(path: str | Path | None, *, required: bool = False) -> list[str]:
    """Every value under a secret-looking key of an ``env.yaml`` (none if it does not exist and is not ``required``).

    The viewer serves no config; these values are masked wherever a rollout or a server's reply
    happens to carry them.

    Raises:
        ConfigError: ``required`` and missing, or not YAML.
    """
    if path is None or not Path(path).is_file():
        if required:
            raise ConfigError(f"env file {str(path)!r} not found")
        return []
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not YAML: {str(exc).splitlines()[0]}") from None
    found: list[str] = []

    def walk(node: Any, secret: bool) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, secret or bool(SECRET_KEY_PATTERN.search(str(key))))
        elif isinstance(node, list):
            for value in node:
                walk(value, secret)
        elif secret and node is not None:
            found.append(str(node))

    walk(data, False)
    return found


def _serve(app: Any, command: str, host: str, port: int, banner: Iterable[str], out: IO[str]) -> int:
    """Serve ``app`` on ``host:port`` from a thread; the main thread waits for Ctrl-C or SIGTERM."""
    import uvicorn

    sock = listen_socket(host, port)  # bound before the URL is printed: it answers as soon as it is read
    url = http_url(host, sock.getsockname()[1]) + "/"
    # A request still running at Ctrl-C (a play step waiting on a slow server) is given 5 s, not forever.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"{PROG}-web", daemon=True)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        thread.start()
        lines = [f"{PROG} {command}: {url}", *banner]
        if not is_loopback(host):
            lines.append(f"warning: listening on {host}: anyone who can reach this machine can open the page")
        lines.append("Ctrl-C to stop.")
        print("\n".join(lines), file=out, flush=True)
        while not stop.wait(0.5):
            if not thread.is_alive():
                raise LaunchError(f"the web server at {url} stopped")
        print(f"{PROG}: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()


def run_view(
    paths: Sequence[str | Path],
    *,
    host: str = LOOPBACK,
    port: int = 0,
    secrets: Iterable[str] = (),
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    out: IO[str] | None = None,
) -> int:
    """Serve the rollout viewer over ``paths`` (and their failure sidecars) until Ctrl-C or SIGTERM.

    Args:
        paths: Rollout JSONL files; one that does not exist yet is shown once it appears.
        host: Address to bind (loopback unless told otherwise).
        port: Port to bind; 0 picks a free one.
        secrets: Values masked in everything served (``env.yaml``'s keys: :func:`env_yaml_secrets`).
        max_row_bytes: Longest line parsed; longer ones are listed as errors.
        out: Where the URL is printed (stdout).

    Returns:
        The exit code (0).
    """
    library = RolloutLibrary(paths, max_row_bytes=max_row_bytes)
    app = create_view_app(library, Scrubber(secrets), bind_host=host)
    banner = []
    for entry in library.files:
        state = "" if entry.path.exists() else "  (not there yet: shown when it appears)"
        banner.append(f"  {entry.kind:<8}  {entry.path}{state}")
    library.start()
    try:
        return _serve(app, "view", host, port, banner, out or sys.stdout)
    finally:
        library.close()


def run_play(
    spec: EnvSpec,
    *,
    host: str = LOOPBACK,
    port: int = 0,
    output: str | Path = "results/played.jsonl",
    secrets: Iterable[str] = (),
    out: IO[str] | None = None,
) -> int:
    """Serve the play page for the env ``spec`` makes until Ctrl-C or SIGTERM.

    Args:
        spec: The ``gym.make`` call of each episode (a bundled server, a config or a URL).
        host: Address to bind (loopback unless told otherwise).
        port: Port to bind; 0 picks a free one.
        output: Where saved episodes are appended as rollout rows.
        secrets: Values masked in everything served.
        out: Where the URL is printed (stdout).

    Returns:
        The exit code (0).
    """
    plays = PlaySessions(spec, output)  # makes the first env: a server that cannot start fails here
    try:
        app = create_play_app(plays, Scrubber(secrets), bind_host=host)
        banner = [f"  server    {plays.server} ({len(plays.rows)} task(s), env {spec.env_id})",
                  f"  saves to  {plays.output}"]
        return _serve(app, "play", host, port, banner, out or sys.stdout)
    finally:
        plays.close()
