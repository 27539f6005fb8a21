"""Servers survive a lost node: the node that holds the server is SIGKILLed mid-collection.

``RayLauncher`` places the server again on the live node, with its spec; ``ray_collect`` and
``RayVectorEnv``, given the launcher, follow the new address; the rollouts that were playing on
the lost server (and on the collection worker that died with the node) come back as failure rows
with the reason, and one resume writes exactly those: every row once. The figures (rows lost to
the kill, seconds to place the server again) are printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.ray_cluster import RayLauncher, RayVectorEnv, ray_collect
from nemo_gym_env.rollouts.identity import task_keys
from nemo_gym_env.rollouts.output import RolloutWriter, failures_path, read_rollouts

from ..conftest import example_rows, scripted
from .players import TokenPolicyFactory

pytestmark = pytest.mark.slow

SERVER = "example_multi_step"
REPEATS = 4


def _nodes() -> tuple[str, str]:
    """(head node id, worker node id)."""
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    head = next(n["NodeID"] for n in alive if "node:__internal_head__" in n["Resources"])
    return head, next(n["NodeID"] for n in alive if n["NodeID"] != head)


def _play_once(envs: RayVectorEnv, seed: int) -> tuple[list[float], list[str | None]]:
    """One scripted episode on every sub-env: each one's reward and error."""
    rows, play, n = example_rows(SERVER), scripted(SERVER), envs.num_envs
    _, infos = envs.reset(seed=seed)
    tasks = [int(t) for t in infos["task_index"]]
    history: list[list] = [[] for _ in range(n)]
    rewards: list[float] = [0.0] * n
    errors: list[str | None] = [None] * n
    live = np.ones(n, dtype=bool)
    while live.any():
        actions = [play(rows[tasks[i]], history[i]) if live[i] else None for i in range(n)]
        obs, step_rewards, terms, truncs, infos = envs.step(actions)
        for i in np.flatnonzero(live):
            history[i] += obs[i]
            if terms[i] or truncs[i]:
                live[i] = False
                rewards[i] = float(step_rewards[i])
                errors[i] = str(infos["error"][i]) if infos.get("_error", np.zeros(n, bool))[i] else None
    return rewards, errors


def test_the_server_of_a_lost_node_is_placed_again_and_followed(ray_cluster, tmp_path: Path) -> None:
    rows = example_rows(SERVER)
    head, doomed = _nodes()
    victim = ray_cluster.node_process(doomed)
    try:
        _lose_the_server_s_node(ray_cluster, victim, rows, head, doomed, tmp_path / "rows.jsonl")
    finally:
        ray_cluster.replace_worker(victim)  # the tests after this one get two nodes again


def _lose_the_server_s_node(ray_cluster, victim, rows: list[dict], head: str, doomed: str, out: Path) -> None:
    placed: list[float] = []
    with RayLauncher(host="127.0.0.1", on_replaced=lambda record: placed.append(time.monotonic())) as launcher:
        server = launcher.start(bundled_spec(SERVER), node_id=doomed)
        old_url = server.url
        envs = RayVectorEnv(num_envs=2, num_workers=1, base_url=launcher, dataset=rows, num_cpus_per_worker=0.25,
                            call_timeout_s=120)
        try:
            _, started = envs.reset(seed=0)  # two episodes in flight on the server about to be lost
            killed_at = 0.0
            with RolloutWriter(out) as writer:
                for row in ray_collect(rows, TokenPolicyFactory(SERVER, delay_s=0.5), launcher, num_workers=2,
                                       num_cpus_per_worker=0.25, num_repeats=REPEATS, concurrency=3, chunk_size=2,
                                       timeout_s=240):
                    writer.write(row)
                    if not killed_at:  # collection is under way on both workers
                        ray_cluster.kill_node(victim)
                        killed_at = time.monotonic()
            lost = writer.failed
            deadline = time.monotonic() + 90
            while not placed and time.monotonic() < deadline:  # (when no rollout was left waiting for it)
                time.sleep(0.5)
            assert placed, "the server was not placed again"
            record = launcher.replacements[0]
            assert len(launcher.replacements) == 1 and record["from_node"] == doomed and record["to_node"] == head
            assert server.node_id == head and server.url != old_url and server.replaced == 1
            assert launcher.urls == {SERVER: server.url}
            failures = [json.loads(line) for line in failures_path(out).read_text().splitlines()] if lost else []
            assert all(f["_ng_failure_class"] == "server_error" and f["failure_reason"] for f in failures)

            # The vector env's episodes on the lost server end truncated with the reason; the next ones play
            # on the new address.
            first = [scripted(SERVER)(rows[int(t)], []) for t in started["task_index"]]
            _, _, terms, truncs, infos = envs.step(first)
            assert truncs.all() and not terms.any() and all(infos["error"]), infos.get("error")
            rewards, errors = _play_once(envs, seed=1)
            assert rewards == [1.0, 1.0] and errors == [None, None]

            with RolloutWriter(out, resume=True) as writer:  # one resume plays what the kill cost
                assert writer.resumed_rows == len(rows) * REPEATS - lost
                for row in ray_collect(rows, TokenPolicyFactory(SERVER), launcher, num_workers=2,
                                       num_cpus_per_worker=0.25, num_repeats=REPEATS, skip=writer.done,
                                       timeout_s=240):
                    writer.write(row)
                assert writer.written == lost and writer.failed == 0
        finally:
            envs.close()
    written, _ = read_rollouts(out)
    keys = task_keys(rows)
    assert sorted((r["_ng_task_key"], r["_ng_rollout_index"]) for r in written) == sorted(
        (keys[t], r) for t in range(len(rows)) for r in range(REPEATS))  # every row exactly once
    assert all(r["reward"] == 1.0 for r in written)
    assert not failures_path(out).exists()  # nothing is still failed
    print(f"\nlost node: {lost} of {len(rows) * REPEATS} rollouts lost to the kill (written by the resume); "
          f"server placed again {placed[0] - killed_at:.1f} s after the kill "
          f"({record['replace_s']:.1f} s from detection to serving on the head node)")
