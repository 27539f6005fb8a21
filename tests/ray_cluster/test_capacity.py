"""Resources accounted for: a server placed on the cluster holds what it needs before rollout workers take the rest.

The bundled ``math`` server, placed by ``RayLauncher``, checks answers as Ray tasks. It holds a CPU
for its process and reserves its verifier's CPUs when it starts; ``ray_collect`` then runs at every
worker count from 1 to all of the cluster's CPUs, and every run's rewards equal the single-machine
run's, row for row. A run that asks for more CPUs than are free fails at once, with the numbers.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest

from nemo_gym_env.errors import ClusterCapacityError
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.ray_cluster import RayLauncher, ray_collect
from nemo_gym_env.rollouts.jobs import collect
from nemo_gym_env.rollouts.output import is_failure

from ..conftest import example_rows
from .players import MathAnswers

pytestmark = pytest.mark.slow

REPEATS = 2


def _rewards(rows: list[dict]) -> dict[tuple[int, int], float]:
    assert not [row for row in rows if is_failure(row)], [r.get("failure_reason") for r in rows if is_failure(r)]
    return {(row["_ng_task_index"], row["_ng_rollout_index"]): row["reward"] for row in rows}


def _single_machine(rows: list[dict]) -> dict[tuple[int, int], float]:
    """The same rollouts in one process against a local math server (its process pool, no Ray)."""
    async def run(url: str) -> list[dict]:
        return [row async for row in collect(rows, MathAnswers(), url, num_repeats=REPEATS, concurrency=4)]

    with Launcher() as launcher:
        return _rewards(asyncio.run(run(launcher.start(bundled_spec("math")).url)))


def test_math_on_ray_tasks_gives_the_single_machine_rewards_at_every_worker_count(ray_cluster) -> None:
    pytest.importorskip("math_verify")
    import ray

    rows = example_rows("math")
    expected = _single_machine(rows)
    assert set(expected.values()) == {0.0, 1.0}  # right and wrong answers: a 0.0 is only ever the model's
    total = int(ray.cluster_resources()["CPU"])
    spec = bundled_spec("math")
    spec = replace(spec, config={**spec.config, "verify_workers": 1})
    with RayLauncher(host="127.0.0.1") as launcher:
        [server] = launcher.start_all([spec])
        assert server.num_cpus == 1.0  # the server's own process
        groups = [g for g in ray.util.placement_group_table().values()
                  if g["state"] == "CREATED" and "math verifier" in (g.get("name") or "")]
        assert len(groups) == 1  # its verifier's CPU, reserved when it started
        free = int(ray.available_resources()["CPU"])
        assert free == total - 2, (free, total)
        for workers in range(1, total + 1):
            cpus = 1.0 if workers <= free else 0.5  # beyond the free CPUs: half a CPU each
            if workers > free:  # at one CPU each it cannot fit: said at once, with the numbers
                message = (rf"ray_collect: {workers} worker\(s\) of 1 CPU and 0 GPU cannot fit: {workers} CPU needed, "
                           rf"the cluster has {total} and {free} free \(held: .*math verifier.*"
                           r"1 CPU by server 'math'\)")
                with pytest.raises(ClusterCapacityError, match=message):
                    next(ray_collect(rows, MathAnswers, launcher, num_workers=workers, num_repeats=REPEATS,
                                     timeout_s=60))
                if workers == free + 1:  # enough CPUs in all, but not on any one node: said too
                    with pytest.raises(ClusterCapacityError, match=r"do not fit in the free CPUs of the nodes"):
                        next(ray_collect(rows, MathAnswers, launcher, num_workers=workers,
                                         num_cpus_per_worker=free / workers, timeout_s=60))
            out = list(ray_collect(rows, MathAnswers, launcher, num_workers=workers, num_cpus_per_worker=cpus,
                                   num_repeats=REPEATS, concurrency=4, chunk_size=2, timeout_s=240))
            assert _rewards(out) == expected, f"{workers} worker(s) of {cpus:g} CPU"
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server.url)


def test_a_server_that_cannot_be_placed_says_so_with_the_numbers(ray_cluster) -> None:
    from nemo_gym_env.errors import LaunchError

    with RayLauncher(host="127.0.0.1", num_cpus=64) as launcher:
        with pytest.raises(LaunchError, match=r"cannot fit: 64 CPU needed, the cluster has \d+ and \d+ free"):
            launcher.start(bundled_spec("example_single_tool_call"))
        assert launcher.servers == {}
