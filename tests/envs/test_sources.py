"""``ServerSet``: every way to name servers, started as real processes on loopback and stopped again."""

from __future__ import annotations

import socket
import urllib.request
from urllib.parse import urlsplit

import pytest

from nemo_gym_env.envs.sources import Server, ServerSet, resolve_server
from nemo_gym_env.errors import ConfigError, UnknownServerError, UsageError
from nemo_gym_env.launch.catalog import bundled_dataset
from nemo_gym_env.launch.head_server import HeadServer
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.server.scaffold import init_server


def answers(url: str) -> bool:
    """Whether something accepts a connection at ``url``'s address."""
    parts = urlsplit(url)
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((parts.hostname, parts.port)) == 0


def test_names_targets_and_folders_become_one_set_started_and_stopped_together(tmp_path, monkeypatch):
    folder = init_server("my_env", tmp_path)
    monkeypatch.chdir(tmp_path)
    servers = ServerSet.launching(["example_multi_step", "gymnasium:FrozenLake-v1", "my_env"])
    assert sorted(servers.names) == ["example_multi_step", "gymnasium_FrozenLake-v1", "my_env"]
    assert servers.urls == {}  # nothing runs before start()
    assert servers["example_multi_step"].bundled == "example_multi_step"
    assert servers["example_multi_step"].examples == bundled_dataset("example_multi_step")
    assert servers["my_env"].bundled is None and servers["my_env"].examples == (folder / "data" / "example.jsonl").resolve()
    assert servers["gymnasium_FrozenLake-v1"].examples is None  # a hosted env's rows come one per seed
    assert servers["gymnasium_FrozenLake-v1"].config["env_id"] == "FrozenLake-v1"
    with servers:
        urls = servers.start()
        assert sorted(urls) == sorted(servers.names)
        for url in urls.values():
            with urllib.request.urlopen(url + "/", timeout=10) as reply:
                assert reply.status == 200
        assert servers.protocols() == {"example_multi_step": "resources", "gymnasium_FrozenLake-v1": "gymnasium",
                                       "my_env": "resources"}
    assert servers.urls == {} and not any(answers(url) for url in urls.values())  # close() stopped them all


def test_start_only_some_and_keys_over_a_servers_config():
    servers = ServerSet.launching(["example_multi_step", "example_single_tool_call"],
                                  server_config={"example_single_tool_call": {"description": "mine"}})
    assert servers["example_single_tool_call"].config["description"] == "mine"
    assert servers["example_multi_step"].config["description"] != "mine"
    with servers:
        assert list(servers.start(["example_single_tool_call"])) == ["example_single_tool_call"]
        assert servers["example_multi_step"].url is None


def test_a_launcher_of_ones_own_starts_them_and_is_closed_with_the_set():
    launcher = Launcher(auto_restart=False)
    servers = ServerSet.launching(["example_single_tool_call"])
    servers.start(launcher=launcher)
    assert servers.launcher is launcher and set(launcher.servers) == {"example_single_tool_call"}
    servers.close()
    assert launcher.closed and servers.launcher is None
    servers.close()  # twice is fine


def test_running_servers_by_url_by_head_server_and_the_command_lines_rule():
    with ServerSet.launching(["example_multi_step", "example_single_tool_call"]) as launched:
        urls = launched.start()
        with HeadServer({}, list(launched.launcher.servers.values()), port=0) as head:
            found = ServerSet.running(head_url=head.url)
            assert found.urls == urls and found["example_multi_step"].bundled == "example_multi_step"
            assert ServerSet.of(["example_multi_step"], head_url=head.url).urls == {
                "example_multi_step": urls["example_multi_step"]}
            with pytest.raises(UsageError, match="has no server 'nope'; it has: example_multi_step"):
                ServerSet.running(head_url=head.url, names=["nope"])
        one = ServerSet.of(["mine"], server_url=urls["example_multi_step"] + "/")
        assert one.urls == {"mine": urls["example_multi_step"]} and one["mine"].spec is None
        assert ServerSet.of(server_url=urls["example_multi_step"]).names == ["server"]
        both = ServerSet.running({"a": "http://127.0.0.1:1"}) | ServerSet.running({"b": "http://127.0.0.1:2"})
        assert both.names == ["a", "b"]
        with one:
            assert one.start() == {"mine": urls["example_multi_step"]}
        assert answers(urls["example_multi_step"])  # closing a set leaves servers it did not start running


def test_wrong_names_fail_before_anything_starts():
    with pytest.raises(UnknownServerError, match="no bundled server named 'no_such_server'"):
        ServerSet.launching(["no_such_server"])
    with pytest.raises(ConfigError, match="gymnasium_NoSuchEnv-v9"):
        ServerSet.launching(["gymnasium:NoSuchEnv-v9"])
    with pytest.raises(UsageError, match="not both"):
        ServerSet.of(server_url="http://127.0.0.1:1", head_url="http://127.0.0.1:2")
    with pytest.raises(UsageError, match="one server"):
        ServerSet.of(["a", "b"], server_url="http://127.0.0.1:1")


def test_an_env_finds_a_server_folder_and_plays_its_example_rows(tmp_path, monkeypatch):
    init_server("folder_env", tmp_path)
    monkeypatch.chdir(tmp_path)
    handle = resolve_server("folder_env", None, None)
    try:
        assert handle.name == "folder_env" and answers(handle.url)
        assert handle.default_dataset == (tmp_path / "folder_env" / "data" / "example.jsonl").resolve()
    finally:
        handle.release()
    assert not answers(handle.url)


def test_a_set_is_plain_data_before_start():
    servers = ServerSet([Server("a", url="http://127.0.0.1:1"), Server("b")])
    assert servers.urls == {"a": "http://127.0.0.1:1"} and "b" in servers and len(servers) == 2
    assert servers.start() == {"a": "http://127.0.0.1:1"}  # nothing to start: b has no spec
    assert repr(servers) == "ServerSet(a=http://127.0.0.1:1, b=not started)"
