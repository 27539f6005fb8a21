"""The package's HTTP transport against aiohttp's client, under the vector env, in one run.

Question: NeMo Gym itself talks HTTP through aiohttp, a well-kept client with a C parser. Would
the vector env be as fast on it as on the package's own transport (``client/transport.py``)?
The rule this benchmark decides: if aiohttp costs no more than 15% in episodes/s or in the
env's CPU per episode, the package should use it; otherwise it keeps its own transport.

For each ``num_envs`` (256 and 1024 by default) and each round, the vector env plays scripted
``example_multi_step`` episodes (as ``throughput.py`` does) once on each transport, in an order
shuffled per round, against the same server processes. The aiohttp side is
:class:`AiohttpClient`: the same ``request()`` contract as ``HttpClient`` (one shared
``ClientSession`` per event loop, a connector as large as the package's pool, no cookie jar,
since the env keeps its own), put in place of ``HttpClient`` in the resources client.

Reported per ``num_envs``: median episodes/s and env CPU seconds per episode of each transport
and aiohttp / ours for both, over the rounds.

Usage::

    python benchmarks/transport_choice.py                      # 256 and 1024 sub-envs, 3 rounds
    python benchmarks/transport_choice.py --num-envs 64 --rounds 1 --min-seconds 2   # a smoke run

Writes ``benchmarks/results/transport_choice.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
import throughput

TRANSPORTS = ("builtin", "aiohttp")
THRESHOLD = 1.15
"""aiohttp is adopted if it costs no more than this factor in episodes/s and in CPU per episode."""


class AiohttpClient:
    """``HttpClient``'s contract on aiohttp: ``request()`` returns a :class:`Reply` whatever the status."""

    _sessions: dict[int, Any] = {}

    def __init__(self, base_url: str, *, connect_retries: int = 3, max_in_flight: int | None = None):
        self.base_url = base_url.rstrip("/")
        self.connect_retries = connect_retries
        self.max_in_flight = max_in_flight
        self._limiter: asyncio.Semaphore | None = None

    @classmethod
    def close_all(cls) -> None:
        """Close the sessions (they live on the package's background loop)."""
        from nemo_gym_env.client.loop import background_loop

        for session in cls._sessions.values():
            if not session.closed:
                background_loop().run(session.close())
        cls._sessions.clear()

    @classmethod
    def _session(cls) -> Any:
        import aiohttp

        from nemo_gym_env.client.transport import MAX_CONNECTIONS_PER_ORIGIN

        loop = asyncio.get_running_loop()
        session = cls._sessions.get(id(loop))
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS_PER_ORIGIN, limit_per_host=0,
                                             keepalive_timeout=30.0)
            session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                            skip_auto_headers=("User-Agent",))
            cls._sessions[id(loop)] = session
        return session

    async def request(self, method: str, path: str, body: bytes = b"", *,
                      headers: Sequence[tuple[str, str]] = (), timeout_s: float = 60.0) -> Any:
        if self.max_in_flight is not None and self._limiter is None:
            self._limiter = asyncio.Semaphore(self.max_in_flight)
        if self._limiter is None:
            return await self._send(method, path, body, headers, timeout_s)
        async with self._limiter:
            return await self._send(method, path, body, headers, timeout_s)

    async def _send(self, method: str, path: str, body: bytes, headers: Sequence[tuple[str, str]],
                    timeout_s: float) -> Any:
        import aiohttp

        from nemo_gym_env.client.transport import Reply
        from nemo_gym_env.errors import ConnectFailed, TransportError

        delay = 0.1
        for attempt in range(self.connect_retries + 1):
            try:
                async with asyncio.timeout(timeout_s):
                    async with self._session().request(method, self.base_url + path, data=body or None,
                                                       headers=list(headers)) as reply:
                        content = await reply.read()
                        return Reply(reply.status, [(k.lower(), v) for k, v in reply.headers.items()], content)
            except aiohttp.ClientConnectorError as exc:
                if attempt == self.connect_retries:
                    raise ConnectFailed(str(exc)) from exc
                await asyncio.sleep(delay)
                delay *= 2
            except aiohttp.ClientError as exc:
                raise TransportError(str(exc)) from exc
        raise AssertionError("unreachable")


@contextlib.contextmanager
def transport(name: str) -> Iterator[None]:
    """Within the block, resources clients made from now on use transport ``name``."""
    from nemo_gym_env.client import resources

    original = resources.HttpClient
    if name == "aiohttp":
        resources.HttpClient = AiohttpClient  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        resources.HttpClient = original  # type: ignore[misc]
        AiohttpClient.close_all()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each transport per num_envs")
    parser.add_argument("--min-seconds", type=float, default=8.0, help="shortest vector run")
    parser.add_argument("--max-seconds", type=float, default=90.0, help="longest vector run")
    parser.add_argument("--servers", type=int, default=1, help="server processes (sharded)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order of the transports")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    settings = throughput.Settings(num_envs=args.num_envs, min_seconds=args.min_seconds,
                                   max_seconds=args.max_seconds)
    rows = harness.tasks()
    runs: list[dict[str, Any]] = []
    with harness.launched(count=args.servers) as procs:
        urls = [p.url for p in procs]
        for num_envs in args.num_envs:
            for round_ in range(args.rounds):
                order = list(TRANSPORTS)
                rng.shuffle(order)
                for name in order:
                    with transport(name):
                        run = throughput.run_vector(urls, rows, num_envs, settings)
                    if run["errors"]:
                        raise SystemExit(f"{name} at {num_envs} sub-envs: {run['errors']} episodes failed")
                    runs.append({"transport": name, "round": round_, **run})
                    print(f"{name:8} num_envs={num_envs:5} round {round_}: {run['episodes_per_s']:8.1f} episodes/s, "
                          f"{run['env_cpu_s_per_episode'] * 1e3:6.2f} ms env CPU per episode", flush=True)
    summary = []
    for num_envs in args.num_envs:
        by = {name: [r for r in runs if r["num_envs"] == num_envs and r["transport"] == name] for name in TRANSPORTS}
        eps = {name: harness.median([r["episodes_per_s"] for r in by[name]]) for name in TRANSPORTS}
        cpu = {name: harness.median([r["env_cpu_s_per_episode"] for r in by[name]]) for name in TRANSPORTS}
        summary.append({
            "num_envs": num_envs,
            "builtin_episodes_per_s": eps["builtin"], "aiohttp_episodes_per_s": eps["aiohttp"],
            "builtin_cpu_ms_per_episode": cpu["builtin"] * 1e3, "aiohttp_cpu_ms_per_episode": cpu["aiohttp"] * 1e3,
            "episodes_per_s_builtin_over_aiohttp": eps["builtin"] / eps["aiohttp"],
            "cpu_per_episode_aiohttp_over_builtin": cpu["aiohttp"] / cpu["builtin"],
        })
    adopt = all(s["episodes_per_s_builtin_over_aiohttp"] <= THRESHOLD
                and s["cpu_per_episode_aiohttp_over_builtin"] <= THRESHOLD for s in summary)
    harness.print_table(
        ["num_envs", "ours ep/s", "aiohttp ep/s", "ours / aiohttp", "ours CPU ms/ep", "aiohttp CPU ms/ep",
         "aiohttp / ours CPU"],
        [[s["num_envs"], s["builtin_episodes_per_s"], s["aiohttp_episodes_per_s"],
          s["episodes_per_s_builtin_over_aiohttp"], s["builtin_cpu_ms_per_episode"],
          s["aiohttp_cpu_ms_per_episode"], s["cpu_per_episode_aiohttp_over_builtin"]] for s in summary],
        title=f"transport choice ({args.rounds} rounds, medians): aiohttp {'within' if adopt else 'beyond'} "
              f"{THRESHOLD:g}x",
    )
    results = {"settings": vars(args) | {"out": None}, "runs": runs, "summary": summary,
               "threshold": THRESHOLD, "aiohttp_within_threshold": adopt}
    harness.write_results("transport_choice", results, args.out)
    return results


if __name__ == "__main__":
    main()
