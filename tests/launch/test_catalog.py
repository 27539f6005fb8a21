"""The bundled catalog (``launch.catalog``): the servers shipped in ``nemo_gym_env.servers``, their specs and data."""

from __future__ import annotations

import pytest

from nemo_gym_env import launch
from nemo_gym_env.errors import UnknownServerError
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers, bundled_spec

BUNDLED = ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt"]


def test_bundled_catalog():
    servers = bundled_servers()
    assert set(BUNDLED) <= set(servers)
    for name in BUNDLED:
        spec = bundled_spec(name)
        assert spec.server_type == "resources_servers" and spec.config["entrypoint"]
        assert launch.resolve_entrypoint(spec).is_file()
        assert bundled_dataset(name).is_file()
    with pytest.raises(UnknownServerError, match="example_multi_step") as err:
        bundled_spec("no_such_server")
    assert isinstance(err.value, KeyError)
