"""Settings of the whole test run (``tests/`` and ``servers/*/tests``), made before any test imports Ray.

Ray takes ``127.0.0.1`` given as a node's address (``ray start --node-ip-address``,
``ray.init``) for "this machine" and advertises the machine's outward address instead, its
servers listening on every interface. Every Ray node the suite starts runs on this machine, so
the suite keeps them on loopback: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` Ray uses
127.0.0.1 for the node and binds there. Ray reads it when it is imported; child processes
(``ray start``, servers, NeMo Gym's stacks) inherit it. Checked by
``tests/ray_cluster/test_servers.py::test_the_cluster_and_its_servers_listen_on_loopback_only``.
"""

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
