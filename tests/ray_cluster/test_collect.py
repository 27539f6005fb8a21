"""ray_collect on the two-node loopback cluster: order, exactly-once, and workers (and a node) dying mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.ray_cluster import RayLauncher, WorkersLost, ray_collect
from nemo_gym_env.rollouts.identity import task_keys
from nemo_gym_env.rollouts.output import is_failure

from ..cli.conftest import cli_env
from ..conftest import example_rows
from .players import TokenPolicyFactory

pytestmark = pytest.mark.slow

SERVER = "example_multi_step"


def _head_node() -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])


@pytest.fixture(scope="module")
def server_url(ray_cluster) -> Iterator[str]:
    # On the head node, out of the way of tests that kill worker processes. (A lost node, server and
    # workers with it: test_lost_node.py.)
    with RayLauncher(host="127.0.0.1") as launcher:
        yield launcher.start(bundled_spec(SERVER), node_id=_head_node()).url


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


def test_step_rewards_are_summed_into_the_reward_as_on_one_machine(server_url: str) -> None:
    """``episode_reward="sum"`` reaches the workers: each row's reward is the verify reward plus its
    step rewards (example_multi_step gives 0.1 a new lookup), as :func:`collect` gives on one machine."""
    rows = example_rows(SERVER)[:2]
    for mode in ("verify", "sum"):
        out = list(ray_collect(rows, TokenPolicyFactory(SERVER), {SERVER: server_url}, num_workers=1,
                               episode_reward=mode, timeout_s=120))
        assert len(out) == 2 and not any(is_failure(row) for row in out), out
        assert all(row["step_reward_sum"] > 0 for row in out)
        if mode == "verify":
            assert [row["reward"] for row in out] == [1.0, 1.0] and not any("verify_reward" in row for row in out)
        else:
            assert [row["verify_reward"] for row in out] == [1.0, 1.0]
            assert [row["reward"] for row in out] == pytest.approx([1.0 + row["step_reward_sum"] for row in out])


def test_skip_resumes_and_sampling_applies(server_url: str) -> None:
    rows = example_rows(SERVER)[:2]
    keys = task_keys(rows)  # one server URL: its rows' server is "server"
    out = list(ray_collect(rows, TokenPolicyFactory(SERVER), server_url, num_workers=1, num_repeats=2,
                           skip=[("server", keys[0], 0), ("server", keys[1], 1)], sampling={"temperature": 0.25},
                           timeout_s=120))
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
    keys = task_keys(rows)
    assert caught.value.missing == [("server", keys[t], r) for t, r in _expected(2, 2)]


PAUSED = b"NEMO_GYM_ENV_TEST_PAUSED"
DRIVER = """
import sys
import time
import ray
from nemo_gym_env.protocol.dataset import load_rows
from nemo_gym_env.ray_cluster import ray_collect
from nemo_gym_env.rollouts.output import RolloutWriter
from tests.ray_cluster.players import TokenPolicyFactory

address, url, tasks, out, pause_at = *sys.argv[1:5], int(sys.argv[5])
ray.init(address=address, log_to_driver=False)
with RolloutWriter(out, resume=True) as writer:
    for row in ray_collect(load_rows(tasks), TokenPolicyFactory("example_multi_step", delay_s=0.05), url,
                           num_workers=2, num_repeats=16, concurrency=4, chunk_size=4, skip=writer.done,
                           timeout_s=300):
        writer.write(row)
        if len(writer.done) == pause_at:  # the workers play on while the driver waits for its SIGKILL
            print("NEMO_GYM_ENV_TEST_PAUSED", flush=True)
            time.sleep(600)
"""


def _wait_for_line(process: subprocess.Popen, marker: bytes, timeout_s: float) -> tuple[bool, list[bytes]]:
    """Whether ``process`` prints the line ``marker`` within ``timeout_s``, and the lines it printed
    (Ray writes its own notices to the driver's standard output too)."""
    lines: list[bytes] = []
    stop = threading.Event()  # the marker came, or the output ended (the process exited)

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if line.strip() == marker:
                break
        stop.set()

    threading.Thread(target=read, daemon=True).start()
    stop.wait(timeout_s)
    return bool(lines) and lines[-1].strip() == marker, lines


def test_a_killed_ray_collect_driver_resumes_with_nothing_lost_or_twice(ray_cluster, server_url: str,
                                                                          tmp_path: Path) -> None:
    """The driver writing ray_collect's rows is SIGKILLed three times mid-run; each rerun skips what is written."""
    rows = example_rows(SERVER)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "rows.jsonl"
    command = [sys.executable, "-c", DRIVER, ray_cluster.address, server_url, str(tasks), str(out)]

    def complete_rows() -> list[dict]:
        *complete, _ = out.read_bytes().split(b"\n") if out.exists() else [b""]
        return [json.loads(line) for line in complete if line.strip()]

    # Rows come out in task order and can arrive in bursts, so a kill timed by watching the file
    # can come too late. The driver instead stops after writing its kill point's row and says so;
    # its Ray workers keep playing their chunks while it is SIGKILLed.
    kills = []
    for kill_at in (5, 30, 55):
        log = tmp_path / f"driver{kill_at}.log"
        with log.open("wb") as stderr:
            driver = subprocess.Popen([*command, str(kill_at)], env=cli_env(), stdout=subprocess.PIPE,
                                      stderr=stderr, start_new_session=True)
        paused, said = _wait_for_line(driver, PAUSED, timeout_s=240)
        if not paused:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=60)
            driver.stdout.close()
            pytest.fail(f"driver said {said!r}, exit {driver.returncode}: {log.read_text(errors='replace')[-3000:]}")
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        driver.stdout.close()
        kills.append(len(complete_rows()))
    assert kills == [5, 30, 55], f"rows at each kill: {kills}"
    finished = subprocess.run([*command, "0"], env=cli_env(), capture_output=True, text=True, timeout=300,
                              check=False)
    assert finished.returncode == 0, f"resume exited {finished.returncode}: {finished.stderr[-3000:]}"
    keys = task_keys(rows)
    got = [("server", r["_ng_task_key"], r["_ng_rollout_index"]) for r in complete_rows()]
    assert sorted(got) == sorted(("server", keys[t], r) for t in range(len(rows)) for r in range(16))
    assert all(r["reward"] == 1.0 for r in complete_rows())
