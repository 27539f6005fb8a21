"""Verify throughput of every bundled server, and whether its other routes stay responsive meanwhile.

For each bundled server that ships a scripted player (``servers/<name>/scripted.py``), this
script launches the server on loopback, builds ``/verify`` bodies from its example rows with
correct scripted play, and then, for ``--seconds``:

- sends ``POST /verify`` with those bodies from ``--concurrency`` concurrent requests on one
  ``httpx.AsyncClient`` (verifications per second, latency p50/p99), and
- probes ``GET /`` on a separate connection every 20 ms: its latency under load, against the
  same probe on the idle server, shows whether verification blocks the event loop (a server
  that scores in its event loop makes every tool route wait behind it).

Single-turn servers (the scripted player answers without a tool call): the scripted message
is the whole response. Tool servers: one episode per row is played through ``NemoGymEnv``
and its ``env.unwrapped.response`` and task row are reused. A server whose verify reads
session state (``example_session_state_mgmt``) scores the replayed bodies without that state;
``replay_reward_mean`` against ``episode_reward_mean`` shows it, and ``note`` says so.

Servers that cannot be played (no scripted player, no example rows, a launch failure, a
player that raises) are skipped with a reason; the script picks up whatever is bundled when
it runs. Results go to ``benchmarks/results/verify_throughput.json`` and a table is printed.
Absolute rates drift on shared machines; compare servers within one run. The client runs in
this process: ``client_cpu_s`` against ``server_cpu_s`` (the server and its child processes,
with psutil) shows which side the rate is bound by; on a 2-core machine the httpx client
often costs more CPU per request than a light verifier.

Run::

    python benchmarks/verify_throughput.py                        # every server, 5 s each
    python benchmarks/verify_throughput.py --seconds 1 --servers example_single_tool_call,reasoning_gym
"""

from __future__ import annotations

import argparse
import asyncio
import http.cookiejar
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "verify_throughput.json"


@dataclass
class Settings:
    """What to run.

    Attributes:
        seconds: Timed load per server.
        concurrency: Concurrent ``/verify`` requests.
        servers: Bundled servers to run (all with a scripted player when empty).
        out: Where the JSON results go.
        warmup_s: Load before timing starts (not counted).
        probe_interval_s: Pause between two ``GET /`` probes.
        idle_probes: ``GET /`` probes on the idle server, the baseline.
        ready_timeout_s: How long a server may take to start.
    """

    seconds: float = 5.0
    concurrency: int = 64
    servers: list[str] = field(default_factory=list)
    out: Path = RESULTS_PATH
    warmup_s: float = 0.5
    probe_interval_s: float = 0.02
    idle_probes: int = 50
    ready_timeout_s: float = 120.0


class Skip(Exception):
    """This server cannot be benchmarked; the message says why."""


# ---- bodies ------------------------------------------------------------------------------------


def _is_tool_turn(items: Sequence[dict[str, Any]]) -> bool:
    return any(item.get("type") == "function_call" for item in items)


def build_bodies(
    name: str, url: str, rows: list[dict[str, Any]], play: Callable[..., list[dict]]
) -> tuple[str, list[dict], list[float]]:
    """``(mode, verify bodies, episode rewards)`` from correct scripted play of every example row.

    Episode rewards are known for tool servers (the env's verify); for single-turn servers
    they are filled in by the sanity pass.
    """
    from nemo_gym_env.envs.env import NemoGymEnv
    from nemo_gym_env.protocol.types import make_response

    try:
        first = play(rows[0], [], correct=True)
    except Exception as exc:
        raise Skip(f"scripted player raised on row 0: {type(exc).__name__}: {exc}") from None
    if not _is_tool_turn(first):
        bodies = []
        for row in rows:
            items = play(row, [], correct=True)
            tools = row["responses_create_params"].get("tools") or []
            response = make_response(items, tools=tools).model_dump(mode="json")
            bodies.append({**row, "response": response})
        return "single_turn", bodies, []
    env = NemoGymEnv(base_url=url, dataset=rows, on_server_error="raise")
    bodies, rewards = [], []
    try:
        for index in range(len(rows)):
            env.reset(options={"task_index": index})
            row, history = env.unwrapped.task, []
            for _ in range(env.max_steps):
                obs, reward, terminated, truncated, _ = env.step(play(row, history, correct=True))
                history.extend(obs)
                if terminated or truncated:
                    break
            bodies.append({**row, "response": env.unwrapped.response.model_dump(mode="json")})
            rewards.append(float(reward))
    finally:
        env.close()
    return "tool", bodies, rewards


# ---- load ----------------------------------------------------------------------------------------


def _no_cookies() -> http.cookiejar.CookieJar:
    """A jar that keeps nothing: every request is a fresh client, as independent episodes are."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def _percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": pick(0.50), "p99": pick(0.99), "max": round(ordered[-1], 3), "n": len(ordered)}


async def _probe_idle(url: str, count: int) -> list[float]:
    latencies = []
    async with httpx.AsyncClient(base_url=url, cookies=_no_cookies(), trust_env=False, timeout=30) as probe:
        for _ in range(count):
            started = time.perf_counter()
            (await probe.get("/")).raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def _load(url: str, payloads: list[bytes], settings: Settings) -> dict[str, Any]:
    """Warm up, then run the timed load with the liveness probe beside it."""
    limits = httpx.Limits(
        max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency
    )
    headers = {"content-type": "application/json"}
    verify_ms: list[float] = []
    rewards: list[float] = []
    probe_ms: list[float] = []
    errors = 0
    first_error: str | None = None
    counting = False
    stop = False

    async with (
        httpx.AsyncClient(
            base_url=url, limits=limits, cookies=_no_cookies(), trust_env=False, timeout=120
        ) as client,
        httpx.AsyncClient(base_url=url, cookies=_no_cookies(), trust_env=False, timeout=120) as probe,
    ):

        async def verifier(offset: int) -> None:
            nonlocal errors, first_error
            i = offset
            while not stop:
                body = payloads[i % len(payloads)]
                i += 1
                started = time.perf_counter()
                try:
                    reply = await client.post("/verify", content=body, headers=headers)
                    ok = reply.status_code == 200
                    detail = None if ok else f"HTTP {reply.status_code}: {reply.text[:200]}"
                    reward = reply.json().get("reward") if ok else None
                except Exception as exc:  # counted, not fatal: the run goes on
                    ok, detail, reward = False, f"{type(exc).__name__}: {exc}", None
                if not counting:
                    continue
                if ok:
                    verify_ms.append((time.perf_counter() - started) * 1000)
                    rewards.append(float(reward) if isinstance(reward, (int, float)) else float("nan"))
                else:
                    errors += 1
                    first_error = first_error or detail

        async def prober() -> None:
            while not stop:
                started = time.perf_counter()
                try:
                    ok = (await probe.get("/")).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if counting and ok:
                    probe_ms.append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(settings.probe_interval_s)

        workers = [asyncio.create_task(verifier(n)) for n in range(settings.concurrency)]
        prober_task = asyncio.create_task(prober())
        await asyncio.sleep(settings.warmup_s)
        counting = True
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        await asyncio.sleep(settings.seconds)
        counting = False
        elapsed = time.perf_counter() - started
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        stop = True
        await asyncio.gather(*workers, prober_task, return_exceptions=True)
    done = [r for r in rewards if not math.isnan(r)]
    return {
        "verifications": len(verify_ms),
        "errors": errors,
        "first_error": first_error,
        "elapsed_s": round(elapsed, 3),
        "verify_per_s": round(len(verify_ms) / elapsed, 1),
        "verify_latency_ms": _percentiles(verify_ms),
        "liveness_under_load_ms": _percentiles(probe_ms),
        "replay_reward_mean": round(statistics.fmean(done), 4) if done else None,
        "client_cpu_s": round(
            (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime), 2
        ),
    }


def _server_cpu_s(pid: int) -> float | None:
    """CPU seconds of a server process and its children so far (needs psutil; None without)."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        total = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return None


# ---- one server ----------------------------------------------------------------------------------


def run_server(name: str, settings: Settings) -> dict[str, Any]:
    """Benchmark one bundled server; a dict for the results file (``status`` ok or skipped)."""
    from nemo_gym_env.errors import LaunchError
    from nemo_gym_env.launch.catalog import bundled_dataset, bundled_spec
    from nemo_gym_env.launch.launcher import Launcher
    from nemo_gym_env.policies import scripted_player
    from nemo_gym_env.protocol.dataset import load_rows

    try:
        play = scripted_player(name)
    except KeyError as exc:
        raise Skip(str(exc.args[0]) if exc.args else "no scripted player") from None
    except Exception as exc:
        raise Skip(f"its scripted player cannot be imported: {type(exc).__name__}: {exc}") from None
    try:
        rows = load_rows(bundled_dataset(name))
        spec = bundled_spec(name)
    except Exception as exc:
        raise Skip(f"no usable example data or config: {type(exc).__name__}: {exc}") from None
    if not rows:
        raise Skip("its example data is empty")
    with Launcher(ready_timeout_s=settings.ready_timeout_s) as launcher:
        try:
            proc = launcher.start(spec)
        except LaunchError as exc:
            raise Skip(f"launch failed: {str(exc).splitlines()[0]}") from None
        try:
            mode, bodies, episode_rewards = build_bodies(name, proc.url, rows, play)
        except Skip:
            raise
        except Exception as exc:
            raise Skip(f"scripted play failed: {type(exc).__name__}: {exc}") from None
        payloads = [json.dumps(body).encode() for body in bodies]
        sanity = _sanity(proc.url, payloads)
        if mode == "single_turn":
            episode_rewards = sanity
        idle = asyncio.run(_probe_idle(proc.url, settings.idle_probes))
        cpu_before = _server_cpu_s(proc.pid)
        load = asyncio.run(_load(proc.url, payloads, settings))
        cpu_after = _server_cpu_s(proc.pid)
    result: dict[str, Any] = {
        "name": name,
        "status": "ok",
        "mode": mode,
        "rows": len(rows),
        "body_bytes_mean": round(statistics.fmean(len(p) for p in payloads)),
        "episode_reward_mean": round(statistics.fmean(episode_rewards), 4) if episode_rewards else None,
        "sanity_reward_mean": round(statistics.fmean(sanity), 4) if sanity else None,
        "concurrency": settings.concurrency,
        **load,
        "liveness_idle_ms": _percentiles(idle),
        "server_cpu_s": None if cpu_before is None or cpu_after is None else round(cpu_after - cpu_before, 2),
    }
    idle_p99 = result["liveness_idle_ms"]["p99"]
    load_p99 = result["liveness_under_load_ms"]["p99"]
    result["liveness_p99_slowdown"] = round(load_p99 / idle_p99, 1) if idle_p99 and load_p99 else None
    played, replayed = result["episode_reward_mean"], result["replay_reward_mean"]
    if played is not None and replayed is not None and abs(played - replayed) > 1e-9:
        result["note"] = (
            f"replayed bodies score {replayed} where the played episodes scored {played}: its verify "
            "reads per-session state, which a replayed body (sent without the episode's cookie) does not reach"
        )
    return result


def _sanity(url: str, payloads: list[bytes]) -> list[float]:
    """Each body verified once, in order: the rewards correct play earns on replay."""
    rewards = []
    with httpx.Client(base_url=url, cookies=_no_cookies(), trust_env=False, timeout=120) as client:
        for payload in payloads:
            reply = client.post("/verify", content=payload, headers={"content-type": "application/json"})
            if reply.status_code != 200:
                raise Skip(
                    f"/verify answered HTTP {reply.status_code} to a scripted body: {reply.text[:300]}"
                )
            rewards.append(float(reply.json().get("reward", float("nan"))))
    return rewards


# ---- all servers ---------------------------------------------------------------------------------


def discover(requested: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Bundled servers to run, and the requested names that are not bundled (with the reason)."""
    from nemo_gym_env.launch.catalog import bundled_servers

    bundled = sorted(bundled_servers())
    if not requested:
        return bundled, {}
    missing = {name: "not a bundled server" for name in requested if name not in bundled}
    return [name for name in requested if name in bundled], missing


def run(settings: Settings) -> dict[str, Any]:
    """Every selected server, one after another (each alone on the machine while measured)."""
    names, missing = discover(settings.servers)
    servers: dict[str, Any] = {
        name: {"name": name, "status": "skipped", "reason": why} for name, why in missing.items()
    }
    for name in names:
        print(f"[verify_throughput] {name} ...", file=sys.stderr, flush=True)
        try:
            servers[name] = run_server(name, settings)
        except Skip as exc:
            servers[name] = {"name": name, "status": "skipped", "reason": str(exc)}
        except Exception as exc:  # one broken server does not stop the others
            servers[name] = {
                "name": name,
                "status": "failed",
                "reason": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=5),
            }
    return {
        "benchmark": "verify_throughput",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {
            "seconds": settings.seconds,
            "concurrency": settings.concurrency,
            "warmup_s": settings.warmup_s,
            "probe_interval_s": settings.probe_interval_s,
            "servers": list(settings.servers),
        },
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        "servers": servers,
    }


def table(results: dict[str, Any]) -> str:
    """The results as a text table."""
    header = (
        f"{'server':28} {'mode':11} {'verify/s':>9} {'verify p50/p99 ms':>18} "
        f"{'GET / idle p50/p99':>19} {'GET / load p50/p99':>19} {'reward':>7} {'errors':>6} {'cpu s client/server':>20}"
    )
    lines = [header, "-" * len(header)]
    for name, r in sorted(results["servers"].items()):
        if r["status"] != "ok":
            lines.append(f"{name:28} {r['status']}: {r['reason'][:110]}")
            continue
        v, idle, load = r["verify_latency_ms"], r["liveness_idle_ms"], r["liveness_under_load_ms"]
        reward = r["replay_reward_mean"]
        lines.append(
            f"{name:28} {r['mode']:11} {r['verify_per_s']:>9.1f} {_pair(v):>18} {_pair(idle):>19} "
            f"{_pair(load):>19} {'' if reward is None else f'{reward:.2f}':>7} {r['errors']:>6} {_cpu(r):>20}"
        )
        if r.get("note"):
            lines.append(f"{'':28} note: {r['note']}")
    return "\n".join(lines)


def _cpu(result: dict[str, Any]) -> str:
    server = result.get("server_cpu_s")
    return f"{result['client_cpu_s']:.2f} / {'-' if server is None else f'{server:.2f}'}"


def _pair(stats: dict[str, Any]) -> str:
    if stats.get("p50") is None:
        return "-"
    return f"{stats['p50']:.1f} / {stats['p99']:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; see the module docstring."""
    parser = argparse.ArgumentParser(description="Verify throughput and liveness of the bundled servers.")
    parser.add_argument(
        "--seconds", type=float, default=Settings.seconds, help="timed load per server (default 5)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=Settings.concurrency,
        help="concurrent /verify requests (default 64)",
    )
    parser.add_argument("--servers", default="", help="comma-separated bundled server names (default: all)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS_PATH, help=f"results JSON (default {RESULTS_PATH})"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.concurrency < 1:
        parser.error("--seconds must be > 0 and --concurrency >= 1")
    settings = Settings(
        seconds=args.seconds,
        concurrency=args.concurrency,
        servers=[s.strip() for s in args.servers.split(",") if s.strip()],
        out=args.out,
    )
    results = run(settings)
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"\nwrote {settings.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
