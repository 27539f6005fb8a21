"""The test cluster keeps every connection on 127.0.0.0/8: its nodes, Ray's workers, the servers they
start and this driver, sampled from /proc while a collection runs across both nodes, and every Python
process of the cluster's own record of where it connected (or looked a name up) since the nodes started:
Ray 2.60 asks cloud metadata servers what it runs on and reports "usage stats disabled" to its makers
unless told otherwise (``cluster.node_env``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.ray_cluster import RayLauncher, ray_collect
from nemo_gym_env.rollouts.output import is_failure

from ..conftest import example_rows
from .players import TokenPolicyFactory
from .sockets import PeerWatch, connected, outside_loopback, process_tree

pytestmark = pytest.mark.slow

SERVER = "example_multi_step"


def test_a_collection_across_both_nodes_talks_only_to_loopback(ray_cluster) -> None:
    members = lambda: process_tree([os.getpid(), *(node.pid for node in ray_cluster.nodes)])
    # The servers listen where Ray says their node is (no host given).
    with PeerWatch(members) as watch, RayLauncher() as launcher:
        servers = launcher.start_all([bundled_spec(SERVER), bundled_spec(SERVER)])
        assert len({server.node_id for server in servers}) == 2, servers  # one on each node
        assert all(server.host.startswith("127.0.0.") for server in servers), servers
        rows = example_rows(SERVER)
        out = list(ray_collect(rows, TokenPolicyFactory(SERVER), launcher, num_workers=2, num_repeats=2,
                               concurrency=4, timeout_s=240))
    assert len(out) == 2 * len(rows) and all(not is_failure(row) and row["reward"] == 1.0 for row in out)
    assert watch.samples >= 10 and watch.connections > 0, (watch.samples, watch.connections)
    assert any(peer.startswith("127.0.0.2:") for peer in watch.peers), sorted(watch.peers)  # the head, by its name
    assert watch.outside_loopback() == {}, watch.outside_loopback()
    logged = connected(Path(ray_cluster.temp_dir) / "connect")
    assert any(peer.startswith("127.0.0.") for peer in logged), logged  # the record holds the run's own connections
    assert outside_loopback(logged) == {}
