"""Old import path of :mod:`tests.ray_cluster` (the Ray tests), kept for ``tests/adapters``.

Only :mod:`tests.ray.players` remains here; no test lives in this folder.
"""
