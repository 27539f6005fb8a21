"""Faults (docs/architecture.md, "Reliability and security"): servers that die, hang or answer garbage, mid-episode.

- A server SIGKILLed under a running vector env, and under ``nemo-gym-env rollouts``: the
  episodes it was serving end truncated with the error, the launcher restarts it on the same
  port, collection goes on, and no episode or output row is lost or duplicated.
- A server that never answers: the per-request timeout fires, the event loop stays free and
  the other sub-envs progress.
- A server that answers garbage (not JSON, wrong schema, 500, a reply trickling forever, a
  reply cut short): a clear error, and a call that reached the server is never sent again;
  a counting fixture server proves each tool call executed exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.env import NemoGymEnv
from nemo_gym_env.envs.vector import NemoGymVectorEnv
from nemo_gym_env.errors import ServerError
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.rollouts.output import failures_path

from ..cli.conftest import CLI, cli_env, descendants, read_jsonl
from ..conftest import example_rows, scripted, wait_until
from .conftest import answer, arm, call, cmdline, counts, faulty_row, percentile

SERVER = "example_multi_step"


# ---- a server killed mid-episode --------------------------------------------------------------------


class _Requests:
    """Wraps a client's ``post_bytes`` (every POST goes through it) to time every request; optionally
    SIGKILLs a server's process group as request number ``kill_at`` starts (the requests already
    sent are the ones it interrupts).
    """

    def __init__(self, client: ResourcesClient, *, kill_pid: int | None = None, kill_at: int | None = None):
        self.inner, self.kill_pid, self.kill_at = client.post_bytes, kill_pid, kill_at
        self.count = 0
        self.killed_at: float | None = None
        self.latencies: list[float] = []
        client.post_bytes = self  # type: ignore[method-assign]

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        if self.kill_pid is not None and self.count == self.kill_at:
            os.killpg(self.kill_pid, signal.SIGKILL)
            self.killed_at = time.monotonic()
        started = time.perf_counter()
        try:
            return await self.inner(*args, **kwargs)
        finally:
            self.latencies.append(time.perf_counter() - started)


@pytest.mark.slow
def test_server_killed_under_a_vector_env_is_restarted_and_collection_goes_on(figures):
    num_envs = 32
    play = scripted(SERVER)
    with Launcher(auto_restart=True, ready_timeout_s=60) as launcher:
        proc = launcher.start(bundled_spec(SERVER))
        url, port, first_pid = proc.url, proc.port, proc.pid
        envs = NemoGymVectorEnv(base_url=url, dataset=example_rows(SERVER), num_envs=num_envs, request_timeout_s=60)
        # Mid-way through the second step of the first episodes: every sub-env has a request out.
        killer = _Requests(envs.client, kill_pid=first_pid, kill_at=num_envs * 2 + num_envs // 2)
        obs, infos = envs.reset(seed=0)
        histories: list[list] = [[] for _ in range(num_envs)]
        seen: dict[int, Any] = {}  # id -> Episode: every episode ever started
        ended: Counter = Counter()
        outcomes: list[tuple[bool, bool, float, str | None]] = []
        ok_after_restart = 0
        restarted_at = None
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            for episode in envs.episodes:
                if episode is not None and (episode.turn > 0 or not episode.done):
                    seen[id(episode)] = episode
            live = envs.live_mask
            current = list(envs.episodes)
            actions = [play(envs.episodes[i].task, histories[i]) if live[i] else None for i in range(num_envs)]
            obs, rewards, terms, truncs, infos = envs.step(actions)
            for i in range(num_envs):
                if not live[i]:  # this step reset sub-env i
                    histories[i] = []
                    continue
                histories[i].extend(obs[i])
                if terms[i] or truncs[i]:
                    ended[id(current[i])] += 1
                    error = infos["error"][i] if "error" in infos and infos["_error"][i] else None
                    outcomes.append((bool(terms[i]), bool(truncs[i]), float(rewards[i]), error))
                    if restarted_at is not None and terms[i] and rewards[i] == 1.0:
                        ok_after_restart += 1
            if restarted_at is None and proc.restarts == 1 and proc.alive() and proc.status == "running":
                restarted_at = time.monotonic()
            if ok_after_restart >= 2 * num_envs:
                break
        envs.close()
        assert killer.killed_at is not None, "the kill never happened"
        assert restarted_at is not None, "the launcher did not restart the server"
        assert proc.port == port and proc.url == url and proc.pid != first_pid
        log = proc.log_path.read_text()
        assert "exited with code -9; restart #1" in log

    interrupted = [o for o in outcomes if o[3] is not None]
    succeeded = [o for o in outcomes if o[3] is None]
    assert interrupted, "no episode was interrupted by the kill"
    for terminated, truncated, reward, error in interrupted:
        assert truncated and not terminated and reward == 0.0
        assert url in error and ("connection" in error or "crashed" in error), error
    assert all(t and not tr and r == 1.0 for t, tr, r, _ in succeeded), "an uninterrupted episode went wrong"
    assert ok_after_restart >= 2 * num_envs, "collection did not go on after the restart"
    assert max(ended.values()) == 1, "an episode ended twice"
    unfinished = [e for k, e in seen.items() if k not in ended]
    assert all(not e.done for e in unfinished), "an episode vanished without ending"
    assert len(ended) + len(unfinished) == len(seen)
    figures.record("sub-envs", num_envs)
    figures.record("episodes started", len(seen))
    figures.record("episodes interrupted by the kill (truncated, info['error'])", len(interrupted))
    figures.record("episodes completed with reward 1.0", len(succeeded))
    figures.record("completed after the restart", ok_after_restart)
    figures.record("episodes ended twice / lost", f"{max(ended.values()) - 1} / {len(seen) - len(ended) - len(unfinished)}")
    figures.record("kill to restarted (server answering)", round(restarted_at - killer.killed_at, 2), "s")
    figures.record("request latency p99 over the run", round(percentile(killer.latencies, 99), 3), "s")


def _server_pids(cli_pid: int) -> list[int]:
    return [p for p in descendants(cli_pid) if "app.py" in cmdline(p)]


def _keys(rows: list[dict]) -> list[tuple[int, int]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_server_killed_under_cli_rollouts_fails_only_its_rollouts(tmp_path, figures):
    out, logs = tmp_path / "rollouts.jsonl", tmp_path / "logs"
    tasks, repeats = len(example_rows(SERVER)), 60
    everything = {(t, r) for t in range(tasks) for r in range(repeats)}
    command = [*CLI, "rollouts", SERVER, "--policy", "scripted", "--num-repeats", str(repeats),
               "--concurrency", "8", "--timeout", "60", "-o", str(out), "--log-dir", str(logs)]
    proc = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kills, rows_at_kill = [], []
    try:
        assert wait_until(lambda: _lines(out) >= 40 or proc.poll() is not None, 120), "no rows in time"
        for _ in range(3):  # a kill between two requests hits nothing; kill again after the restart
            pids = wait_until(lambda: _server_pids(proc.pid), 60)
            assert pids and proc.poll() is None, "the run ended before the kill"
            rows_at_kill.append(_lines(out))
            os.killpg(pids[0], signal.SIGKILL)
            kills.append(pids[0])
            restarted = wait_until(lambda: [p for p in _server_pids(proc.pid) if p not in kills], 60)
            assert restarted, "the launcher did not restart the server"
            if wait_until(lambda: _lines(failures_path(out)) > 0, 5) or proc.poll() is not None:
                break
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    rows, failures = read_jsonl(out), read_jsonl(failures_path(out))
    done, failed = _keys(rows), _keys(failures)
    assert failures, f"no rollout was interrupted by {len(kills)} kill(s)"
    assert proc.returncode == 1, stderr[-2000:]  # finished, with failed rollouts to --resume
    assert len(done) == len(set(done)), "duplicated output rows"
    assert not set(done) & set(failed), "a rollout is both done and failed"
    assert set(done) | set(failed) == everything and len(done) + len(failed) == len(everything), "lost rollouts"
    assert all(r["reward"] == 1.0 for r in rows)
    for failure in failures:
        assert failure["_ng_failure_class"] == "server_error"
        assert "connection" in failure["failure_reason"] or "crashed" in failure["failure_reason"]
    assert len(rows) > rows_at_kill[-1] + 20, "collection did not go on after the restart"
    log = (logs / f"{SERVER}.log").read_text()
    assert "exited with code -9; restart #1" in log

    resumed = subprocess.run([*command, "--resume"], env=cli_env(), capture_output=True, text=True,
                             timeout=240, check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = _keys(read_jsonl(out))
    assert len(final) == len(set(final)) and set(final) == everything
    figures.record("rollouts planned", len(everything))
    figures.record("server kills (SIGKILL)", len(kills))
    figures.record("rollouts failed by the kill(s) (server_error, in the failures file)", len(failed))
    figures.record("rollouts written in the killed run", len(done))
    figures.record("rows written after the last kill", len(rows) - rows_at_kill[-1])
    figures.record("duplicates / lost after --resume", f"{len(final) - len(set(final))} / {len(everything - set(final))}")


@pytest.mark.slow
def test_an_episode_whose_session_state_died_with_the_server_is_truncated():
    """The restarted process signs with a new secret, so the episode's cookie is refused (410)
    rather than opening a new, empty session whose reward 0 would look like a real verdict."""
    server = "example_session_state_mgmt"
    play = scripted(server)
    with Launcher(auto_restart=True, ready_timeout_s=60) as launcher:
        proc = launcher.start(bundled_spec(server))
        env = NemoGymEnv(base_url=proc.url, dataset=example_rows(server), request_timeout_s=60)
        env.reset(options={"task_index": 0})
        history = []
        obs, *_ = env.step(play(env.unwrapped.task, history))  # the increments: state on the server
        history += obs
        first_pid = proc.pid
        os.killpg(first_pid, signal.SIGKILL)
        assert wait_until(lambda: proc.restarts == 1 and proc.pid != first_pid and proc.alive(), 60)
        for _ in range(5):
            obs, reward, terminated, truncated, info = env.step(play(env.unwrapped.task, history))
            history += obs
            if terminated or truncated:
                break
        env.close()
    assert truncated and not terminated and "session lost" in info.get("error", ""), \
        f"ended terminated={terminated} with reward {reward}: {info}"


# ---- a server that hangs ----------------------------------------------------------------------------


def _ticker(stop: threading.Event, lags: list[float]) -> None:
    """Measures the background loop's lag every 20 ms until ``stop``."""

    async def tick() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0.02)
            lags.append(time.perf_counter() - started - 0.02)

    asyncio.run_coroutine_threadsafe(tick(), background_loop().loop)


@pytest.mark.slow
def test_hanging_server_times_out_and_the_rest_goes_on(faulty_server, figures):
    url, timeout = faulty_server.url, 2.0
    arm(url, reset=True)
    num_envs = 8
    envs = NemoGymVectorEnv(base_url=url, dataset=[faulty_row()], num_envs=num_envs, request_timeout_s=timeout)
    single = NemoGymEnv(base_url=url, dataset=[faulty_row()], request_timeout_s=timeout)
    timed = _Requests(envs.client)
    envs.reset(seed=0)
    stop, lags, side_steps = threading.Event(), [], []

    def other_env() -> None:  # another env on the same loop and pool, stepping during the hang
        while not stop.is_set():
            single.reset()
            _, _, _, truncated, _ = single.step([call("ok")])
            side_steps.append(truncated)

    _ticker(stop, lags)
    side = threading.Thread(target=other_env)
    side.start()
    started = time.monotonic()
    actions = [[call("hang")]] + [[call("ok")]] * (num_envs - 1)
    obs, rewards, terms, truncs, infos = envs.step(actions)
    elapsed = time.monotonic() - started
    stop.set()
    side.join(30)
    envs.close()
    single.close()
    assert truncs.tolist() == [True] + [False] * (num_envs - 1)
    assert f"no answer within {timeout:g} s" in infos["error"][0] and "/hang" in infos["error"][0]
    assert all(json.loads(o[0]["output"]) == {"ok": True} for o in obs[1:])
    assert timeout <= elapsed < timeout + 3
    fast = sorted(timed.latencies)[: num_envs - 1]
    assert max(fast) < 1.0, "the other sub-envs' calls waited for the hanging one"
    assert len(side_steps) >= 5 and not any(side_steps), "another env on the loop did not progress"
    assert max(lags) < 0.5
    figures.record("request timeout", timeout, "s")
    figures.record("hung sub-env: truncated after", round(elapsed, 2), "s")
    figures.record("other sub-envs' calls: slowest", round(max(fast), 3), "s")
    figures.record("steps of another env on the same loop during the hang", len(side_steps))
    figures.record("event loop lag, max during the hang", round(max(lags) * 1000, 1), "ms")


@pytest.mark.slow
@pytest.mark.parametrize("route", ["/seed_session", "/verify"])
def test_hang_at_seed_or_verify_is_a_bounded_error(faulty_server, route, figures):
    url = faulty_server.url
    arm(url, reset=True)
    arm(url, route, ["hang"])
    envs = NemoGymVectorEnv(base_url=url, dataset=[faulty_row()], num_envs=2, request_timeout_s=1.5,
                            verify_timeout_s=1.5)
    started = time.monotonic()
    obs, infos = envs.reset(seed=0)
    if route == "/verify":
        assert "error" not in infos
        _, _, terms, truncs, infos = envs.step([[answer()], [answer()]])
        assert sorted(truncs.tolist()) == [False, True] and terms.sum() == 1
    elapsed = time.monotonic() - started
    envs.close()
    errors = [e for e, has in zip(infos["error"], infos["_error"]) if has]
    assert len(errors) == 1 and route in errors[0] and "no answer within 1.5 s" in errors[0]
    assert elapsed < 1.5 + 3
    assert counts(url)["arrivals"][route] == 2  # one each; the hung one was not sent again
    figures.record(f"hang at {route}: error after", round(elapsed, 2), "s")


# ---- a server that answers garbage: clear errors, and exactly once --------------------------------------


MODES = ["garbage", "wrong_schema", "500", "hang", "trickle", "cut"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_tool_call_that_reached_the_server_runs_exactly_once(faulty_server, mode, figures):
    url = faulty_server.url
    arm(url, reset=True)
    arm(url, "/effect", [mode])
    nonce = uuid.uuid4().hex
    env = NemoGymEnv(base_url=url, dataset=[faulty_row()], request_timeout_s=1.5)
    env.reset()
    started = time.monotonic()
    obs, reward, terminated, truncated, info = env.step([call("effect", {"nonce": nonce})])
    elapsed = time.monotonic() - started
    if mode in ("garbage", "wrong_schema", "500"):  # the raw reply is the tool output the model reads
        assert not truncated and not terminated
        output = obs[0]["output"]
        assert {"garbage": "502 Bad Gateway", "wrong_schema": "unexpected", "500": "internal failure"}[mode] in output
        env.step([answer()])
    else:
        assert truncated and not terminated
        expected = "no answer within 1.5 s" if mode in ("hang", "trickle") else "connection failed mid-request"
        assert expected in info["error"] and "/effect" in info["error"], info["error"]
        assert elapsed < 1.5 + 3
    env.close()
    seen = counts(url)
    assert seen["effects"] == {nonce: 1}, "the tool ran more than once"
    assert seen["arrivals"]["/effect"] == 1, "the tool call was sent more than once"
    figures.record(f"{mode}: tool executions / deliveries", f"{seen['effects'][nonce]} / {seen['arrivals']['/effect']}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("route", ["/seed_session", "/verify"])
def test_garbage_at_seed_or_verify_is_a_clear_error_sent_once(faulty_server, route, mode):
    url = faulty_server.url
    arm(url, reset=True)
    arm(url, route, [mode])
    env = NemoGymEnv(base_url=url, dataset=[faulty_row()], request_timeout_s=1.5, verify_timeout_s=1.5)
    expected = {
        "garbage": "reply is not JSON",
        "wrong_schema": "unusable verify reply: no numeric 'reward'",
        "500": "HTTP 500: {\"error\": \"internal failure",
        "hang": "no answer within 1.5 s",
        "trickle": "no answer within 1.5 s",
        "cut": "connection failed mid-request",
    }[mode]
    try:
        if route == "/seed_session":
            if mode == "wrong_schema":  # a seed reply may be any JSON (server-specific)
                env.reset()
            else:
                with pytest.raises(ServerError, match="/seed_session") as error:
                    env.reset()
                assert expected in str(error.value)
        else:
            env.reset()
            _, reward, terminated, truncated, info = env.step([answer()])
            assert truncated and not terminated and reward == 0.0
            assert expected in info["error"] and "/verify" in info["error"], info["error"]
    finally:
        env.close()
    assert counts(url)["arrivals"][route] == 1


class _AcceptAndDrop:
    """A TCP server that reads a little of each request, then closes: a reply that never comes."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.recv(65536)
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.sock.close()


def test_a_request_that_may_have_arrived_is_never_resent(figures):
    """Connection failures after sending are not retried; refused connects are, a bounded number of times."""
    dropper = _AcceptAndDrop()
    client = ResourcesClient(dropper.url, timeout_s=5)
    try:
        for route in ("/effect", "/seed_session", "/verify"):
            with pytest.raises(ServerError, match="connection failed mid-request"):
                background_loop().run(client.post_json(route, {"nonce": "x"}, {}))
        assert dropper.accepted == 3
    finally:
        dropper.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        refused_url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # bound, not listening: refused
        refusing = ResourcesClient(refused_url, timeout_s=5)
        started = time.monotonic()
        with pytest.raises(ServerError, match="cannot connect"):
            background_loop().run(refusing.post_json("/effect", {}, {}))
        elapsed = time.monotonic() - started
    assert elapsed < 3
    figures.record("connections per request whose reply never came", dropper.accepted / 3)
    figures.record("refused connection: connect attempts", refusing.connect_retries + 1)
    figures.record("refused connection: error after", round(elapsed, 2), "s")
