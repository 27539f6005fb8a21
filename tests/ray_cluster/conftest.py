"""A two-node Ray cluster on loopback for the tests of this folder (2 CPUs per node), stopped after them.

Package-scoped: tests elsewhere that start a private Ray of their own (``ray.init("local")``)
run after it is gone and this process is disconnected. Under pytest-xdist every test here is in
one ``xdist_group`` (``SHARED_STACKS`` in ``tests/conftest.py``: ``--dist loadgroup`` runs them on one
worker, which starts one cluster); each cluster has its own free port and temporary folder, so two
workers with clusters do not collide.

The cluster's authentication token and mode are set in this process's environment at
collection, before any test imports ``ray``: Ray reads its authentication mode at import.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

from .cluster import LocalCluster, cluster_env

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed (pip install 'nemo-gym-env[ray]')", allow_module_level=True)

os.environ.update({k: v for k, v in cluster_env().items() if k != "PYTHONPATH"})



@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[LocalCluster]:
    """Head + one worker node; this process is connected to it."""
    import ray

    if ray.is_initialized():  # another test's private local Ray
        ray.shutdown()
    cluster = LocalCluster.start(workers=1)
    try:
        yield cluster
    finally:
        cluster.stop()
