"""RayLauncher on the two-node loopback cluster: placement, the head server, stopping, math on Ray tasks."""

from __future__ import annotations

import time
from dataclasses import replace

import httpx
import pytest

from nemo_gym_env.client.head_client import fetch_servers
from nemo_gym_env.envs.env import NemoGymEnv
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_spec
from nemo_gym_env.launch.config import load_config, server_specs
from nemo_gym_env.launch.head_server import HeadServer
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.ray_cluster import RayLauncher, connect, ray_address

from ..conftest import play_episode

pytestmark = pytest.mark.slow


def _refused(url: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/", timeout=1.0)
        except httpx.HTTPError:
            return True
        time.sleep(0.25)
    return False


def test_servers_spread_over_nodes_and_the_head_server_reports_them(ray_cluster) -> None:
    names = ["example_single_tool_call", "example_multi_step"]
    with RayLauncher(host="127.0.0.1") as launcher:
        servers = launcher.start_all([bundled_spec(name) for name in names])
        assert [s.name for s in servers] == names
        assert len({s.node_id for s in servers}) == 2  # the nodes in turn: one each
        for server in servers:
            env = NemoGymEnv(base_url=server.url, dataset=bundled_dataset(server.name))
            reward, terminated, _, _ = play_episode(env, server.name, seed=0)
            assert (reward, terminated) == (1.0, True)
            env.close()
        with HeadServer({}, servers, port=0) as head:  # the launcher's servers are what the head reports
            assert fetch_servers(head.url) == {s.name: s.url for s in servers}
            records = httpx.get(head.url + "/server_instances", timeout=10).json()
            assert {r["name"]: r["status"] for r in records} == dict.fromkeys(names, "running")
        assert all(s.status == "running" for s in launcher.refresh().values())
        assert "serving example_single_tool_call" in servers[0].log_tail()  # read on its node
        launcher.stop("example_multi_step")
        assert list(launcher.servers) == ["example_single_tool_call"]
        assert _refused(servers[1].url, 15)
    assert _refused(servers[0].url, 15)
    assert launcher.closed


def test_a_server_goes_down_with_its_actor(ray_cluster) -> None:
    import ray

    with RayLauncher(host="127.0.0.1") as launcher:
        server = launcher.start(bundled_spec("example_single_tool_call"))
        assert httpx.get(server.url + "/", timeout=5).status_code == 200
        ray.kill(server._actor, no_restart=True)  # the actor dies as on a lost node: its server follows
        assert _refused(server.url, 20)
        assert launcher.refresh()["example_single_tool_call"].status == "failed"


def test_a_failing_server_is_a_launch_error_with_its_log(ray_cluster, tmp_path) -> None:
    from nemo_gym_env.errors import LaunchError
    from nemo_gym_env.launch.config import ServerSpec

    (tmp_path / "app.py").write_text("raise SystemExit('no such server here')\n")
    spec = ServerSpec("broken", "resources_servers", "broken", {"entrypoint": str(tmp_path / "app.py")})
    with RayLauncher(host="127.0.0.1", ready_timeout_s=30) as launcher:
        with pytest.raises(LaunchError, match=r"(?s)'broken' could not be started.*exited with code 1.*no such server here"):
            launcher.start(spec)
        assert launcher.servers == {}


def test_math_verifies_with_ray_tasks_on_the_cluster(ray_cluster) -> None:
    pytest.importorskip("math_verify")
    import ray

    with RayLauncher(host="127.0.0.1") as launcher:
        [server] = launcher.start_all([bundled_spec("math")])
        assert server.spec.config["ray_head_node_address"] == launcher.gcs_address
        env = NemoGymEnv(base_url=server.url, dataset=bundled_dataset("math"))
        for correct, expected in ((True, 1.0), (False, 0.0)):
            reward, _, _, info = play_episode(env, "math", correct=correct, seed=0)
            assert reward == expected, info
        env.close()
        # The server joined the cluster as a driver (its math-verify runs as Ray tasks there).
        drivers = {job["DriverPid"] for job in ray._private.state.jobs() if not job["IsDead"]}
        assert server.pid in drivers


def test_nemo_gyms_global_ray_key_reaches_every_resources_server(tmp_path) -> None:
    config = tmp_path / "two.yaml"
    config.write_text(
        "ray_head_node_address: 10.0.0.1:6379\n"
        "a: {resources_servers: {a: {entrypoint: app.py}}}\n"
        "b: {resources_servers: {b: {entrypoint: app.py, ray_head_node_address: 10.0.0.2:6379}}}\n"
    )
    specs = {s.instance_name: s for s in server_specs(load_config([config], env_yaml=None))}
    assert specs["a"].config["ray_head_node_address"] == "10.0.0.1:6379"
    assert specs["b"].config["ray_head_node_address"] == "10.0.0.2:6379"  # a server's own setting wins
    assert ray_address({"ray_head_node_address": "10.0.0.1:6379"}) == "10.0.0.1:6379"
    assert ray_address({}, "auto") == "auto"


def test_connect_reuses_the_connection(ray_cluster) -> None:
    import ray

    assert connect() == ray.get_runtime_context().gcs_address
    assert connect("192.0.2.99:1") == ray.get_runtime_context().gcs_address  # already connected: kept


def test_code_gen_runs_its_sandboxed_tests_as_ray_tasks(ray_cluster) -> None:
    import ray

    spec = bundled_spec("code_gen")
    spec = replace(spec, config={**spec.config, "max_concurrent": 2})  # 2 CPUs reserved for its tests
    with RayLauncher(host="127.0.0.1") as launcher:
        [server] = launcher.start_all([spec])
        groups = [g for g in ray.util.placement_group_table().values()
                  if g["state"] == "CREATED" and "code_gen sandbox" in (g.get("name") or "")]
        assert [len(g["bundles"]) for g in groups] == [2]
        env = NemoGymEnv(base_url=server.url, dataset=bundled_dataset("code_gen"))
        for correct, expected in ((True, 1.0), (False, 0.0)):
            reward, _, _, info = play_episode(env, "code_gen", correct=correct, seed=0)
            assert reward == expected, info
        env.close()
        drivers = {job["DriverPid"] for job in ray._private.state.jobs() if not job["IsDead"]}
        assert server.pid in drivers
        # The program's parent is the Ray worker that ran the task, not the server process;
        # the same request to a code_gen server without Ray passes (its parent is that server).
        assert _parent_is_the_server(server) == (0.0, "wrong_answer")
    with Launcher() as local:
        assert _parent_is_the_server(local.start(bundled_spec("code_gen"))) == (1.0, None)


def _parent_is_the_server(server) -> tuple[float, str | None]:
    row = {"responses_create_params": {"input": [{"role": "user", "content": "pid"}]},
           "verifier_metadata": {"unit_tests": {"inputs": [""], "outputs": [f"{server.pid}\n"]}}}
    answer = "```python\nimport os\nprint(os.getppid())\n```"
    message = {"type": "message", "role": "assistant", "id": "m", "content": [{"type": "output_text", "text": answer}]}
    reply = httpx.post(f"{server.url}/verify", timeout=120, json={
        **row, "response": make_response([message]).model_dump(mode="json", exclude_none=True)}).json()
    return reply["reward"], reply.get("failure_kind")
