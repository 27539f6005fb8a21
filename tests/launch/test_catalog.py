"""The bundled catalog (``launch.catalog``): the servers shipped in ``nemo_gym_env.servers``, their
specs, configs and data, and what a lookup of an unknown name says."""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path

import pytest

from nemo_gym_env import launch
from nemo_gym_env.errors import ConfigError, NemoGymError, UnknownServerError
from nemo_gym_env.launch import catalog
from nemo_gym_env.launch.catalog import bundled_config_path, bundled_dataset, bundled_servers, bundled_spec
from nemo_gym_env.protocol.dataset import load_rows

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


EVERY_SERVER = {"badge_lookup", "code_gen", "example_multi_step", "example_session_state_mgmt", "retail_support",
                "example_single_tool_call", "guess_number", "instruction_following", "math", "mcqa", "reasoning_gym",
                "frozen_lake", "taxi", "blackjack", "cliff_walking", "textarena_tower_of_hanoi", "textarena_sudoku",
                "textarena_guess_the_number", "textarena_tic_tac_toe", "git_history"}


def test_every_bundled_server_is_in_the_catalog_with_its_folder():
    servers = bundled_servers()
    assert set(servers) == EVERY_SERVER
    package = Path(importlib.import_module(catalog.SERVERS_PACKAGE).__file__).parent
    for name, folder in servers.items():
        assert folder == package / name
        assert (folder / "app.py").is_file() and (folder / "configs" / f"{name}.yaml").is_file()


@pytest.mark.parametrize("name", sorted(EVERY_SERVER))
def test_spec_config_and_dataset_of_a_bundled_server(name):
    folder = bundled_servers()[name]
    spec = bundled_spec(name)
    assert (spec.instance_name, spec.server_type, spec.impl_name) == (name, "resources_servers", name)
    assert spec.config_dir == folder / "configs"
    assert launch.resolve_entrypoint(spec) == folder / "app.py"
    assert bundled_config_path(name) == folder / "configs" / f"{name}.yaml"
    assert bundled_dataset(name) == folder / "data" / "example.jsonl"
    assert len(load_rows(bundled_dataset(name))) >= 1


@pytest.mark.parametrize("lookup", [bundled_spec, bundled_dataset, bundled_config_path])
def test_an_unknown_name_lists_the_bundled_servers(lookup):
    with pytest.raises(UnknownServerError) as err:
        lookup("no_such_server")
    message = str(err.value)
    available = ", ".join(sorted(EVERY_SERVER))
    assert f"no bundled server named 'no_such_server'; available: {available}" in message
    assert isinstance(err.value, KeyError) and isinstance(err.value, NemoGymError)


def _write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _server_yaml(*instances: str) -> str:
    return "".join(f"{i}:\n  resources_servers:\n    {i}:\n      entrypoint: app.py\n      domain: other\n"
                   for i in instances)


@pytest.fixture
def other_package(tmp_path, monkeypatch) -> Path:
    """The catalog reading another installed package of server folders, built on disk."""
    name = f"servers_{uuid.uuid4().hex[:8]}"
    root = tmp_path / name
    _write(root / "__init__.py")
    _write(root / "no_data" / "app.py")
    _write(root / "no_data" / "configs" / "no_data.yaml", _server_yaml("no_data"))
    _write(root / "two" / "app.py")
    _write(root / "two" / "configs" / "two.yaml", _server_yaml("two", "second"))
    _write(root / "no_app" / "configs" / "no_app.yaml", _server_yaml("no_app"))
    _write(root / "no_config" / "app.py")
    _write(root / "other_name" / "app.py")
    _write(root / "other_name" / "configs" / "renamed.yaml", _server_yaml("renamed"))
    _write(root / "README.md", "not a server")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(catalog, "SERVERS_PACKAGE", name)
    return root


def test_only_folders_with_app_and_their_own_config_are_servers(other_package):
    assert bundled_servers() == {"no_data": other_package / "no_data", "two": other_package / "two"}
    with pytest.raises(UnknownServerError, match="available: no_data, two$"):
        bundled_spec("no_app")


def test_a_server_without_example_data_or_with_two_servers_in_its_config(other_package):
    assert bundled_spec("no_data").instance_name == "no_data"
    missing = r"bundled server 'no_data' has no example data at .*example\.jsonl"
    with pytest.raises(FileNotFoundError, match=missing):
        bundled_dataset("no_data")
    with pytest.raises(ConfigError, match=r"two\.yaml must define exactly one resources server, found 2"):
        bundled_spec("two")


def test_no_package_no_servers(monkeypatch):
    monkeypatch.setattr(catalog, "SERVERS_PACKAGE", f"no_such_package_{uuid.uuid4().hex[:8]}")
    assert bundled_servers() == {}
    with pytest.raises(UnknownServerError, match=r"available: none \(is the package installed\?\)"):
        bundled_spec("math")


def test_a_server_whose_program_is_missing_is_named_and_left_out(monkeypatch, tmp_path):
    from nemo_gym_env.launch.catalog import missing_program
    from nemo_gym_env.rollouts.plan import _default_servers

    assert bundled_spec("git_history").config["requires_programs"] == ["git"]
    if catalog.missing_extra("git_history"):
        pytest.skip("git_history's extra is not installed: it is left out for that first")
    assert missing_program("git_history") is None  # git is on this machine's PATH
    assert missing_program("example_multi_step") is None  # no programs asked for
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no git
    assert missing_program("git_history") == "git"
    said: list[str] = []
    servers = _default_servers(said.append)
    assert "git_history" not in servers and "example_multi_step" in servers
    [skipping] = [line for line in said if line.startswith("skipping")]
    assert "git_history (needs the git program on PATH)" in skipping
