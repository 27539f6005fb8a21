"""RayVectorEnv on the two-node loopback cluster: the same results as the local vector env in
every autoreset mode, bad input that changes nothing, workers on both nodes, and a worker
killed mid-run whose episodes start over while the other shard goes on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from nemo_gym_env.envs.vector import NemoGymVectorEnv
from nemo_gym_env.errors import ActionError
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.ray_cluster import RayLauncher, RayVectorEnv
from nemo_gym_env.ray_cluster.capacity import free_per_node

from ..conftest import example_rows, scripted

pytestmark = pytest.mark.slow

SERVER = "example_multi_step"
NUM_ENVS = 5  # shards of 3 and 2: uneven on purpose


@pytest.fixture(scope="module")
def server_url(ray_cluster) -> Iterator[str]:
    with RayLauncher(host="127.0.0.1") as launcher:
        yield launcher.start(bundled_spec(SERVER)).url


def _ray_env(url: str, mode: AutoresetMode = AutoresetMode.NEXT_STEP, **kwargs: Any) -> RayVectorEnv:
    return RayVectorEnv(num_envs=NUM_ENVS, num_workers=2, base_url=url, dataset=example_rows(SERVER),
                        autoreset_mode=mode, num_cpus_per_worker=0.25, call_timeout_s=120, **kwargs)


def _local_env(url: str, mode: AutoresetMode = AutoresetMode.NEXT_STEP) -> NemoGymVectorEnv:
    return NemoGymVectorEnv(num_envs=NUM_ENVS, base_url=url, dataset=example_rows(SERVER), autoreset_mode=mode)


class Driver:
    """Plays the bundled scripted player on every live sub-env of a vector env, Gymnasium style.

    ``tasks`` are the rows the sub-envs play (read from ``infos["task_index"]``), so the same
    driver works on any vector env, local or on Ray.
    """

    def __init__(self, mode: AutoresetMode, num_envs: int = NUM_ENVS):
        self.mode = mode
        self.n = num_envs
        self.play = scripted(SERVER)
        self.rows = example_rows(SERVER)
        self.tasks: list[int] = [-1] * num_envs
        self.history: list[list] = [[] for _ in range(num_envs)]

    def started(self, infos: dict[str, Any], mask: np.ndarray | None = None) -> None:
        """Note the sub-envs (in ``mask``, or all reported) that began a new episode."""
        for i in range(self.n):
            if infos.get("_task_index", np.zeros(self.n, bool))[i] and (mask is None or mask[i]):
                self.tasks[i] = int(infos["task_index"][i])
                self.history[i] = []

    def actions(self, live: np.ndarray) -> list[Any]:
        return [self.play(self.rows[self.tasks[i]], self.history[i]) if live[i] else None for i in range(self.n)]

    def stepped(self, actions: list[Any], obs: tuple, terms: np.ndarray, truncs: np.ndarray,
                infos: dict[str, Any]) -> None:
        for i in range(self.n):
            restarted = (actions[i] is None and self.mode == AutoresetMode.NEXT_STEP) or (
                (terms[i] or truncs[i]) and self.mode == AutoresetMode.SAME_STEP)
            if restarted:
                self.tasks[i] = int(infos["task_index"][i])
                self.history[i] = []
            elif actions[i] is not None:
                self.history[i] += obs[i]


def _same_infos(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for key, value in a.items():
        if isinstance(value, dict):
            _same_infos(value, b[key])
        else:
            assert list(value) == list(b[key]), key


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_same_results_as_the_local_vector_env(server_url: str, mode: AutoresetMode) -> None:
    envs = [_ray_env(server_url, mode), _local_env(server_url, mode)]
    try:
        outs = [env.reset(seed=3) for env in envs]
        assert outs[0][0] == outs[1][0]
        _same_infos(outs[0][1], outs[1][1])
        driver = Driver(mode)
        driver.started(outs[1][1])
        ended = finals = 0
        for _ in range(14):
            live = envs[1].live_mask if mode != AutoresetMode.SAME_STEP else np.ones(NUM_ENVS, bool)
            assert envs[0].live_mask.tolist() == envs[1].live_mask.tolist()
            actions = driver.actions(live)
            results = [env.step(actions) for env in envs]
            (obs, rewards, terms, truncs, infos), local = results[0], results[1]
            assert obs == local[0]
            for got, want in zip((rewards, terms, truncs), local[1:4]):
                assert got.tolist() == want.tolist()
            _same_infos(infos, local[4])
            assert rewards[terms].tolist() == [1.0] * int(terms.sum()) and not truncs.any()
            ended += int(terms.sum())
            finals += int(infos.get("_final_obs", np.zeros(NUM_ENVS, bool)).sum())
            driver.stepped(actions, obs, terms, truncs, infos)
            if mode == AutoresetMode.DISABLED and terms.any():
                done = ~envs[1].live_mask
                resets = [env.reset(options={"reset_mask": done}) for env in envs]
                assert resets[0][0] == resets[1][0]
                _same_infos(resets[0][1], resets[1][1])
                driver.started(resets[1][1], done)
        assert ended >= NUM_ENVS  # every sub-env finished at least one episode, each with reward 1.0
        assert finals == (ended if mode == AutoresetMode.SAME_STEP else 0)
    finally:
        for env in envs:
            env.close()


def test_a_bad_action_anywhere_plays_nothing(server_url: str) -> None:
    envs = [_ray_env(server_url), _local_env(server_url)]
    try:
        starts = [env.reset(seed=11) for env in envs]
        driver = Driver(AutoresetMode.NEXT_STEP)
        driver.started(starts[1][1])
        good = driver.actions(np.ones(NUM_ENVS, bool))
        ray_env = envs[0]
        with pytest.raises(ActionError, match=r"sub-env 4: "):
            ray_env.step([*good[:4], {"type": "no_such_item"}])
        with pytest.raises(ValueError, match=r"sub-env 3 is live and needs an action"):
            ray_env.step([*good[:3], None, good[4]])
        with pytest.raises(ValueError, match=r"4 actions given for num_envs=5"):
            ray_env.step(good[:4])
        with pytest.raises(ValueError, match=r"unknown reset options"):
            ray_env.reset(options={"tasks": [0] * NUM_ENVS})
        # Shard 0 (sub-envs 0-2) had valid actions in every refused step: none of them was played.
        results = [env.step(good) for env in envs]
        assert results[0][0] == results[1][0]
        assert results[0][1].tolist() == results[1][1].tolist()
    finally:
        for env in envs:
            env.close()


def _room_on_every_node(cpus: float, timeout_s: float = 30.0) -> None:
    """Wait until each alive node shows ``cpus`` free: the workers of the test before are killed
    asynchronously, and until their CPUs are given back, placement sees a node as full."""
    deadline = time.monotonic() + timeout_s
    while True:
        free = {node: float(res.get("CPU", 0.0)) for node, res in free_per_node().items()}
        if len(free) >= 2 and all(value >= cpus for value in free.values()):
            return
        assert time.monotonic() < deadline, f"free CPUs per node stayed {free}"
        time.sleep(0.2)


def test_workers_start_their_own_servers_on_both_nodes(ray_cluster) -> None:
    _room_on_every_node(1.0)
    envs = RayVectorEnv(f"NemoGym/{SERVER}-v0", num_envs=4, num_workers=2, num_cpus_per_worker=1.0,
                        call_timeout_s=120)
    try:
        places = envs.workers()
        assert len({p["node_id"] for p in places}) == 2, places  # room for one on each node: one worker each
        assert [p["sub_envs"] for p in places] == [(0, 2), (2, 4)]
        obs, infos = envs.reset(seed=0, options={"task_indices": [0, 1, 2, 3]})
        assert infos["task_index"].tolist() == [0, 1, 2, 3] and "error" not in infos
        driver = Driver(AutoresetMode.NEXT_STEP, num_envs=4)
        driver.started(infos)
        finished: dict[int, float] = {}
        for _ in range(10):
            actions = driver.actions(envs.live_mask)
            obs, rewards, terms, truncs, infos = envs.step(actions)
            for i in np.flatnonzero(terms | truncs):
                finished.setdefault(int(i), float(rewards[i]))
            driver.stepped(actions, obs, terms, truncs, infos)
            if len(finished) == 4:
                break
        assert finished == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    finally:
        envs.close()


def _kill_worker(envs: RayVectorEnv, shard: int) -> int:
    pid = envs.workers()[shard]["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED],
                         ids=lambda m: m.value)
def test_a_killed_worker_truncates_its_shard_and_its_tasks_start_over(server_url: str, mode: AutoresetMode) -> None:
    envs = _ray_env(server_url, mode)
    try:
        obs, infos = envs.reset(seed=5)
        tasks = infos["task_index"].tolist()
        driver = Driver(mode)
        driver.started(infos)
        first = driver.actions(np.ones(NUM_ENVS, bool))
        obs, rewards, terms, truncs, infos = envs.step(first)  # one turn played everywhere
        driver.stepped(first, obs, terms, truncs, infos)
        killed = _kill_worker(envs, 1)  # sub-envs 3 and 4
        actions = driver.actions(np.ones(NUM_ENVS, bool))
        obs, rewards, terms, truncs, infos = envs.step(actions)
        assert truncs.tolist() == [False, False, False, True, True] and not terms[3:].any()
        if mode == AutoresetMode.SAME_STEP:
            errors = infos["final_info"]["error"]
            assert infos["task_index"][3:].tolist() == tasks[3:]  # started over at once, on the same tasks
            assert obs[3] and obs[4]
        else:
            errors = infos["error"]
            assert not infos["_error"][:3].any()
        assert all("Ray worker of sub-envs 3-4 lost" in str(e) for e in errors[3:])
        assert len(envs.lost_workers) == 1 and envs.workers()[1]["pid"] != killed
        assert envs.workers()[1]["restarts"] == 1
        driver.stepped(actions, obs, terms, truncs, infos)
        if mode == AutoresetMode.NEXT_STEP:
            assert envs.live_mask.tolist()[3:] == [False, False]
            actions = driver.actions(envs.live_mask)
            obs, rewards, terms, truncs, infos = envs.step(actions)  # sub-envs 3, 4 start over
            assert infos["task_index"][3:].tolist() == tasks[3:]
            driver.stepped(actions, obs, terms, truncs, infos)
        elif mode == AutoresetMode.DISABLED:
            with pytest.raises(ValueError, match=r"sub-env 3 has ended"):
                envs.step(driver.actions(np.ones(NUM_ENVS, bool)))
            mask = np.array([False, False, False, True, True])
            obs, infos = envs.reset(options={"reset_mask": mask})
            assert infos["task_index"][3:].tolist() == tasks[3:]
            driver.started(infos, mask)
        # The replayed episodes and the untouched ones both finish with reward 1.0.
        finished = {}
        for _ in range(10):
            live = envs.live_mask if mode != AutoresetMode.SAME_STEP else np.ones(NUM_ENVS, bool)
            actions = driver.actions(live)
            obs, rewards, terms, truncs, infos = envs.step(actions)
            for i in np.flatnonzero(terms | truncs):
                if actions[i] is not None:
                    finished.setdefault(int(i), (float(rewards[i]), bool(truncs[i])))
            driver.stepped(actions, obs, terms, truncs, infos)
            if len(finished) == NUM_ENVS:
                break
        assert finished == {i: (1.0, False) for i in range(NUM_ENVS)}
    finally:
        envs.close()


def test_bad_arguments_are_refused_with_the_reason(ray_cluster) -> None:
    with pytest.raises(ValueError, match=r"num_workers <= num_envs"):
        RayVectorEnv(SERVER, num_envs=2, num_workers=3)
    with pytest.raises(ValueError, match=r"names no bundled server"):
        RayVectorEnv("NemoGym/Generic-v0", num_envs=2, num_workers=1)
    with pytest.raises(RuntimeError, match=r"a Ray worker could not start its shard of the vector env: .*"
                                           r"no_such_server"):
        RayVectorEnv("no_such_server", num_envs=2, num_workers=1, num_cpus_per_worker=0.25, call_timeout_s=120)
