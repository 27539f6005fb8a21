"""ray_collect on the two-node loopback cluster: order, exactly-once, and workers (and a node) dying mid-run."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.ray_cluster import RayLauncher, WorkersLost, ray_collect
from nemo_gym_env.rollouts.output import is_failure

from ..conftest import example_rows
from .players import TokenPolicyFactory

pytestmark = pytest.mark.slow

SERVER = "example_multi_step"


@pytest.fixture(scope="module")
def server_url(ray_cluster) -> Iterator[str]:
    with RayLauncher(host="127.0.0.1") as launcher:
        yield launcher.start(bundled_spec(SERVER)).url


def _keys(rows: list[dict]) -> list[tuple[int, int]]:
    return [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows]


def _expected(tasks: int, repeats: int) -> list[tuple[int, int]]:
    return [(t, r) for t in range(tasks) for r in range(repeats)]


def test_rows_stream_back_in_order_exactly_once(server_url: str) -> None:
    rows = example_rows(SERVER)
    out = list(ray_collect(rows, TokenPolicyFactory(SERVER), {SERVER: server_url}, num_workers=2,
                           num_repeats=3, concurrency=4, chunk_size=3, timeout_s=240))
    assert _keys(out) == _expected(len(rows), 3)
    assert all(not is_failure(row) and row["reward"] == 1.0 for row in out)
    assert all("generation_token_ids" in row["response"]["output"][-1] for row in out)


def test_skip_resumes_and_sampling_applies(server_url: str) -> None:
    rows = example_rows(SERVER)[:2]
    out = list(ray_collect(rows, TokenPolicyFactory(SERVER), server_url, num_workers=1, num_repeats=2,
                           skip=[(0, 0), (1, 1)], sampling={"temperature": 0.25}, timeout_s=120))
    assert _keys(out) == [(0, 1), (1, 0)]
    assert all(row["responses_create_params"]["temperature"] == 0.25 for row in out)


def _kill_one(pid_dir: Path, within_s: float = 60.0) -> int:
    deadline = time.monotonic() + within_s
    while not list(pid_dir.iterdir()):
        assert time.monotonic() < deadline, "no worker built its policy"
        time.sleep(0.1)
    pid = int(next(iter(pid_dir.iterdir())).name)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_worker_loses_no_row_and_duplicates_none(server_url: str, tmp_path: Path) -> None:
    rows = example_rows(SERVER)
    lost: list[tuple[int, str]] = []
    factory = TokenPolicyFactory(SERVER, delay_s=0.25, pid_dir=str(tmp_path))
    stream = ray_collect(rows, factory, server_url, num_workers=2, num_repeats=4, concurrency=3, chunk_size=2,
                         timeout_s=300, on_worker_lost=lambda index, reason: lost.append((index, reason)))
    out = [next(stream)]  # collection is under way on both workers
    killed = _kill_one(tmp_path)
    out += list(stream)
    assert _keys(out) == _expected(len(rows), 4)  # all present, exactly once, in order
    assert all(row["reward"] == 1.0 for row in out)
    assert len(lost) == 1, lost  # exactly the worker that was killed
    assert killed > 0


def test_every_worker_dying_names_the_rows_left(server_url: str, tmp_path: Path) -> None:
    rows = example_rows(SERVER)[:2]
    factory = TokenPolicyFactory(SERVER, delay_s=2.0, pid_dir=str(tmp_path))
    killer = threading.Thread(target=_kill_one, args=(tmp_path,), daemon=True)
    killer.start()
    with pytest.raises(WorkersLost, match=r"all 1 Ray rollout workers died; 4 rollouts left") as caught:
        list(ray_collect(rows, factory, server_url, num_workers=1, num_repeats=2, timeout_s=120))
    killer.join(5)
    assert caught.value.missing == _expected(2, 2)


def test_a_lost_node_loses_no_row(ray_cluster, tmp_path: Path) -> None:
    """The worker node's processes are killed mid-collection (a lost machine); its rollouts re-run on the head."""
    import ray

    rows = example_rows(SERVER)
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
    worker_node = ray_cluster.nodes[1]
    try:
        with RayLauncher(host="127.0.0.1") as launcher:
            url = launcher.start(bundled_spec(SERVER), node_id=head).url  # the server survives the node
            factory = TokenPolicyFactory(SERVER, delay_s=0.25)
            stream = ray_collect(rows, factory, url, num_workers=2, num_repeats=3, concurrency=3, chunk_size=2,
                                 timeout_s=300)
            out = [next(stream)]
            ray_cluster.kill_node(worker_node)
            out += list(stream)
        assert _keys(out) == _expected(len(rows), 3)
    finally:
        ray_cluster.nodes.remove(worker_node)
        ray_cluster.add_worker("worker-again")  # later tests get two nodes again
        ray_cluster.wait_nodes(2, 180)
