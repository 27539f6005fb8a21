"""Load (docs/architecture.md: "Reliability and security", "Performance"): thousands of concurrent sessions on one server, bounded state.

Each session is one episode of the session-counter server (seed, two increments, a read,
``/verify``), played over and over through the product's client (one pool, per-session
cookies) until the time is up; all sessions are open at once. The fixture server attaches a
32 KiB payload to every session, so state that is not freed shows in its resident memory.

- CI: 2,048 concurrent sessions for ~20 s. Soak (``NEMO_GYM_ENV_SOAK=1``, by hand): 16,384
  for ``NEMO_GYM_ENV_SOAK_S`` seconds (default 300).
- No error; the server's memory is flat after the warm-up (sessions are freed at
  ``/verify``); p50/p99 request latency is reported.
- Abandoned sessions (seeded, never verified) go after ``session_ttl_s``, and never exceed
  ``max_sessions``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.errors import ServerError
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.servers.example_session_state_mgmt.scripted import increments

from ..conftest import example_rows
from ..fixtures import fixture_specs
from .conftest import percentile, rss_bytes, soak, with_config

pytestmark = pytest.mark.slow

PAYLOAD = 32 * 1024
MIB = 1024 * 1024


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/_stats", timeout=30, trust_env=False).json()


class _Sampler(threading.Thread):
    """Samples a process's RSS every ``interval_s``: (seconds since start, bytes)."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[tuple[float, int]] = []
        self._done = threading.Event()
        self.started = time.monotonic()

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.samples.append((time.monotonic() - self.started, rss_bytes(self.pid)))

    def stop(self) -> list[tuple[float, int]]:
        self._done.set()
        self.join(5)
        return self.samples


class _Load:
    """``sessions`` concurrent episodes, replayed until ``duration_s`` has passed."""

    def __init__(self, url: str, sessions: int, duration_s: float, timeout_s: float = 120.0):
        self.url, self.sessions, self.duration_s = url, sessions, duration_s
        self.client = ResourcesClient(url, timeout_s=timeout_s, verify_timeout_s=timeout_s)
        self.latencies: list[float] = []
        self.episode_s: list[float] = []
        self.errors: Counter = Counter()
        self.episodes = 0
        self.first_round_done_s: float | None = None  # when every session had finished one episode
        self.started = time.monotonic()
        rows = example_rows("example_session_state_mgmt")
        final = make_response([{"type": "message", "role": "assistant", "id": "m", "status": "completed",
                                "content": [{"type": "output_text", "text": "done", "annotations": []}]}])
        response = final.model_dump(mode="json", exclude_none=True)
        self.plays = [(row, increments(row), {**row, "response": response}) for row in rows]

    async def _timed(self, coro: Any) -> Any:
        started = time.perf_counter()
        try:
            return await coro
        finally:
            self.latencies.append(time.perf_counter() - started)

    async def _session(self, index: int, deadline: float) -> None:
        row, steps, verify_body = self.plays[index % len(self.plays)]
        while time.monotonic() < deadline:
            jar: dict[str, str] = {}
            started = time.perf_counter()
            try:
                await self._timed(self.client.seed_session(row, jar))
                for step in steps:
                    await self._timed(self.client.post_json("/increment_counter", {"count": step}, jar))
                count = await self._timed(self.client.post_json("/get_counter_value", {}, jar))
                reply = await self._timed(self.client.verify(verify_body, jar))
            except ServerError as exc:
                self.errors[str(exc)[:200]] += 1
                continue
            if count != {"count": row["expected_count"]} or reply["reward"] != 1.0:
                self.errors[f"wrong episode: count {count}, reward {reply['reward']}"] += 1
            self.episodes += 1
            self.episode_s.append(time.perf_counter() - started)
            if self.episodes == self.sessions:
                self.first_round_done_s = time.monotonic() - self.started

    async def run(self) -> float:
        self.started = time.monotonic()
        deadline = self.started + self.duration_s
        await asyncio.gather(*(self._session(i, deadline) for i in range(self.sessions)))
        return time.monotonic() - self.started


def _launch_load_server(launcher: Launcher, **config: Any) -> Any:
    spec = with_config(fixture_specs("reliability")["rel_load"], payload_bytes=PAYLOAD, access_log=False, **config)
    return launcher.start(spec)


def _run_load(sessions: int, duration_s: float, figures: Any) -> None:
    with Launcher(ready_timeout_s=60) as launcher:
        proc = _launch_load_server(launcher)
        idle = rss_bytes(proc.pid)
        sampler = _Sampler(proc.pid)
        sampler.start()
        load = _Load(proc.url, sessions, duration_s)
        elapsed = asyncio.run(load.run())
        samples = sampler.stop()
        end = _stats(proc.url)
    assert not load.errors, load.errors.most_common(5)
    assert load.episodes >= sessions, "not every session finished an episode"
    assert end["live"] == 0 and end["payloads"] == 0, end  # every session freed at /verify
    assert end["evicted"] == 0 and end["expired"] == 0, end  # ... by /verify, not by the cap or the TTL
    # Memory flat after warm-up: the warm-up is the first round (every session has played one
    # episode, all open at once); every later episode must reuse what /verify freed. A leak of
    # the 32 KiB per session would add 64 MiB per round of 2,048.
    rounds = load.episodes / sessions
    assert load.first_round_done_s is not None and rounds >= 1.5, f"too few episodes ({rounds:.2f} per session)"
    offset = sampler.started - load.started
    warm = [rss for t, rss in samples if t + offset <= load.first_round_done_s]
    later = [rss for t, rss in samples if t + offset > load.first_round_done_s]
    assert warm and later
    growth = max(later) - max(warm)
    assert growth <= 12 * MIB, f"server RSS grew {growth / MIB:.1f} MiB after warm-up"
    figures.record("concurrent sessions", sessions)
    figures.record("duration", round(elapsed, 1), "s")
    figures.record("episodes (5 requests each)", load.episodes)
    figures.record("episodes per session", round(rounds, 2))
    figures.record("requests", len(load.latencies))
    figures.record("requests per second", round(len(load.latencies) / elapsed))
    figures.record("errors", sum(load.errors.values()))
    figures.record("request latency p50", round(percentile(load.latencies, 50) * 1000, 1), "ms")
    figures.record("request latency p99", round(percentile(load.latencies, 99) * 1000, 1), "ms")
    figures.record("request latency max", round(max(load.latencies) * 1000, 1), "ms")
    figures.record("episode latency p99", round(percentile(load.episode_s, 99), 2), "s")
    figures.record("server RSS idle", round(idle / MIB, 1), "MiB")
    figures.record("warm-up (first episode of every session) took", round(load.first_round_done_s, 1), "s")
    figures.record("server RSS peak in warm-up", round(max(warm) / MIB, 1), "MiB")
    figures.record("server RSS peak after warm-up", round(max(later) / MIB, 1), "MiB")
    figures.record("server RSS growth after warm-up", round(growth / MIB, 1), "MiB")
    figures.record("live sessions at the end", end["live"])


def test_2048_concurrent_sessions_no_error_flat_memory(figures):
    _run_load(2048, 20.0, figures)


@pytest.mark.skipif(not soak(), reason="soak: run by hand with NEMO_GYM_ENV_SOAK=1")
def test_soak_16384_concurrent_sessions(figures):
    _run_load(16_384, float(os.environ.get("NEMO_GYM_ENV_SOAK_S", "300")), figures)


async def _abandon(client: ResourcesClient, count: int) -> int:
    """Seed ``count`` sessions concurrently and walk away; returns how many were seeded."""
    row = example_rows("example_session_state_mgmt")[0]
    replies = await asyncio.gather(*(client.seed_session(row, {}) for _ in range(count)), return_exceptions=True)
    return sum(1 for r in replies if not isinstance(r, BaseException))


async def _ttl_cycles(url: str, ttl: float, sessions: int, cycles: int) -> tuple[list[int], int]:
    client = ResourcesClient(url, timeout_s=120)  # one loop, one pool: connections are reused
    rss_after, peak_live = [], 0
    for cycle in range(cycles):
        assert await _abandon(client, sessions) == sessions
        opened = await asyncio.to_thread(_stats, url)
        # On a busy machine seeding 2,048 sessions can outlast the TTL: the first ones may
        # already be gone, but every session is either live or expired, none is missing.
        assert opened["live"] + opened["expired"] == sessions * (cycle + 1), opened
        assert opened["live"] > 0 and opened["payloads"] == opened["live"], opened
        peak_live = max(peak_live, opened["live"])
        await asyncio.sleep(ttl + 0.5)
        gone = await asyncio.to_thread(_stats, url)  # any access expires what is past the TTL
        assert gone["live"] == 0 and gone["payloads"] == 0, gone
        assert gone["expired"] == sessions * (cycle + 1) and gone["evicted"] == 0, gone
        rss_after.append(gone["rss_bytes"])
    return rss_after, peak_live


def test_abandoned_sessions_expire_by_ttl_and_memory_stays_flat(figures):
    ttl, sessions, cycles = 3.0, 2048, 3
    with Launcher(ready_timeout_s=60) as launcher:
        proc = _launch_load_server(launcher, session_ttl_s=ttl)
        rss_after, peak_live = asyncio.run(_ttl_cycles(proc.url, ttl, sessions, cycles))
    # Cycle 1 is the warm-up; later cycles reuse the memory the expired sessions gave back.
    growth = max(rss_after[1:]) - rss_after[0]
    assert growth <= 8 * MIB, [round(r / MIB, 1) for r in rss_after]
    figures.record("session_ttl_s", ttl, "s")
    figures.record("abandoned sessions per cycle x cycles", f"{sessions} x {cycles}")
    figures.record("live right after seeding (peak)", peak_live)
    figures.record("live after TTL, every cycle", 0)
    figures.record("expired by TTL", sessions * cycles)
    figures.record("server RSS after each cycle", [round(r / MIB, 1) for r in rss_after], "MiB")
    figures.record("server RSS growth after cycle 1", round(growth / MIB, 1), "MiB")


def test_abandoned_sessions_never_exceed_the_cap(figures):
    cap, sessions = 1000, 2048
    with Launcher(ready_timeout_s=60) as launcher:
        proc = _launch_load_server(launcher, max_sessions=cap)
        assert asyncio.run(_abandon(ResourcesClient(proc.url, timeout_s=120), sessions)) == sessions
        stats = _stats(proc.url)
    assert stats["live"] == cap and stats["payloads"] == cap, stats
    assert stats["evicted"] == sessions - cap, stats
    figures.record("max_sessions", cap)
    figures.record("abandoned sessions", sessions)
    figures.record("live / evicted", f"{stats['live']} / {stats['evicted']}")


def test_finished_event_loops_give_their_connections_back(figures):
    """Each ``asyncio.run(collect(...))`` of a training script opens up to 1024 connections on a
    new loop; once that loop is finished and collected, its sockets must not stay open."""
    import gc

    with Launcher(ready_timeout_s=60) as launcher:
        proc = _launch_load_server(launcher)
        open_after = []
        for _ in range(5):
            assert asyncio.run(_abandon(ResourcesClient(proc.url, timeout_s=120), 300)) == 300
            gc.collect()
            open_after.append(len(os.listdir("/proc/self/fd")))
    growth = max(open_after[1:]) - open_after[0]
    figures.record("open descriptors after each of 5 asyncio.run(300 concurrent requests)", open_after)
    assert growth < 50, f"descriptors grow with every finished event loop: {open_after}"
