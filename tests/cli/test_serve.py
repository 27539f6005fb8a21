"""``nemo-gym-env serve``: real server processes and a head server on loopback."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import gymnasium as gym
import httpx
import pytest
import yaml

import nemo_gym_env  # noqa: F401  (registers the ids)
from nemo_gym_env.client.head_client import fetch_global_config, fetch_servers, server_urls_from_global_config
from nemo_gym_env.launch.catalog import bundled_dataset

from ..conftest import play_episode
from .conftest import CANARY, assert_one_line_error, descendants, read_jsonl, run_cli, wait_gone

pytestmark = pytest.mark.slow

NAME = "example_multi_step"
IMPL = f"{NAME}.resources_servers.{NAME}"


def test_serve_head_server_episode_rollouts_and_sigterm(serve, tmp_path):
    logs = tmp_path / "logs"
    served = serve(
        NAME,
        "+head_server.port=0",
        f"+policy_api_key={CANARY}",
        f"+{IMPL}.note=${{policy_api_key}}",  # an interpolated copy under a harmless key
        "--log-dir",
        str(logs),
    )
    children = descendants(served.proc.pid)
    assert children, "serve started no server process"
    head = served.head
    replies = []
    with httpx.Client(trust_env=False, timeout=10) as http:
        live = http.get(head + "/")
        assert live.json() == {"status": "ok"}
        servers = http.get(head + "/servers")
        assert servers.json() == {NAME: served.urls[NAME]}
        raw = http.get(head + "/global_config_dict_yaml")
        instances = http.get(head + "/server_instances")
        replies += [live.text, servers.text, raw.text, instances.text]
        # NeMo Gym's contract: a JSON-encoded YAML string.
        doc = yaml.safe_load(raw.json())
        block = doc[NAME]["resources_servers"][NAME]
        assert f"http://{block['host']}:{block['port']}" == served.urls[NAME]
        assert doc["head_server"]["port"] == int(head.rsplit(":", 1)[1])
        assert doc["policy_api_key"] == "***REDACTED***"
        assert block["note"] == "***REDACTED***"
        assert http.get(served.urls[NAME] + "/").json() == {"status": "ok"}
        assert instances.json()[0]["status"] == "running"
    assert fetch_servers(head) == {NAME: served.urls[NAME]}
    assert server_urls_from_global_config(fetch_global_config(head)) == {NAME: served.urls[NAME]}

    env = gym.make("NemoGym/Generic-v0", base_url=served.urls[NAME], dataset=str(bundled_dataset(NAME)))
    try:
        reward, terminated, truncated, _ = play_episode(env, NAME, options={"task_index": 1})
    finally:
        env.close()
    assert (reward, terminated, truncated) == (1.0, True, False)

    out = tmp_path / "r.jsonl"
    result = run_cli("rollouts", "--head-url", head, "--policy", "scripted", "--num-repeats", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(out)
    assert len(rows) == 10 and all(r["reward"] == 1.0 for r in rows)

    code, stdout, stderr = served.stop(signal.SIGTERM)
    assert code == 0, stderr
    assert wait_gone(children) == set(), "server processes outlived serve"
    log_text = "".join(p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file())
    for text in (stdout, stderr, log_text, result.stdout, result.stderr, *replies):
        assert CANARY not in text
    assert "ready in" in stdout


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["in-a-terminal", "started-with-sigint-ignored"])
def test_ctrl_c_stops_everything(serve, sigint_ignored):
    served = serve("example_single_tool_call", "+head_server.port=0", sigint_ignored=sigint_ignored)
    if sigint_ignored:
        status = Path(f"/proc/{served.proc.pid}/status").read_text()
        assert int(status.split("SigIgn:")[1].split()[0], 16) & (1 << (signal.SIGINT - 1)) == 0  # serve took it back
    children = descendants(served.proc.pid)
    code, _, stderr = served.stop(signal.SIGINT)
    assert code == 0, stderr
    assert wait_gone(children) == set()
    with pytest.raises(httpx.HTTPError):
        httpx.get(served.head + "/", timeout=2, trust_env=False)


def test_taken_head_port_is_one_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("serve", NAME, f"+head_server.port={port}")
    assert_one_line_error(result)
    assert f"127.0.0.1:{port}" in result.stderr


def test_a_server_that_cannot_start_is_one_line_and_its_traceback_is_for_debug(tmp_path):
    """A bridged MCP server that hangs at start-up: the cause named in one line; ``--debug`` shows the traceback."""
    folder = tmp_path / "stuck"
    (folder / "configs").mkdir(parents=True)
    (folder / "app.py").write_text("from nemo_gym_env.server.mcp_bridge import McpResourcesServer\n\n"
                                   "if __name__ == '__main__':\n    McpResourcesServer.run_webserver()\n")
    (folder / "configs" / "stuck.yaml").write_text(yaml.safe_dump({"stuck": {"resources_servers": {"stuck": {
        "entrypoint": "app.py", "start_timeout_s": 3,
        "mcp_server": {"command": "{python}", "args": ["-c", "import time; time.sleep(600)"]}}}}}))
    command = ("serve", f"+config_paths=[{folder / 'configs' / 'stuck.yaml'}]", "+head_server.port=0")
    result = run_cli(*command)
    assert_one_line_error(result)
    assert "error: server 'stuck' did not start: MCP server" in result.stderr and "did not start within 3 s" in result.stderr
    debug = run_cli(*command, "--debug")
    assert debug.returncode != 0 and "Traceback (most recent call last)" in debug.stderr


def test_nothing_to_serve_and_unknown_name():
    assert_one_line_error(run_cli("serve"))
    result = run_cli("serve", "no_such_server")
    assert_one_line_error(result)
    assert "available:" in result.stderr and NAME in result.stderr


def test_config_paths_serve(serve, tmp_path):
    """Any NeMo-Gym-style config works, and agent/model blocks are reported, not started."""
    config = tmp_path / "both.yaml"
    server_yaml = bundled_dataset(NAME).parent.parent / "configs" / f"{NAME}.yaml"
    config.write_text(
        json.dumps(
            {
                "config_paths": [str(server_yaml)],
                "my_agent": {
                    "responses_api_agents": {
                        "simple_agent": {
                            "entrypoint": "app.py",
                            "resources_server": {"type": "resources_servers", "name": NAME},
                        }
                    }
                },
            }
        )
    )
    served = serve(f"+config_paths=[{config}]", "+head_server.port=0")
    assert set(served.urls) == {NAME, "head_server"}
    code, _, stderr = served.stop()
    assert code == 0
    assert "not starting 'my_agent'" in stderr


def test_standalone_launch_example_runs():
    import subprocess
    import sys

    from .conftest import REPO, cli_env

    result = subprocess.run([sys.executable, str(REPO / "examples" / "standalone_launch.py")], env=cli_env(),
                            capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr
    assert "episode reward: 1.0" in result.stdout and "no server left running" in result.stdout


def test_http_picks_every_servers_parser(serve, tmp_path):
    logs = tmp_path / "logs"
    served = serve(NAME, "+head_server.port=0", "--http", "h11", "--log-dir", str(logs))
    assert httpx.get(served.urls[NAME] + "/", timeout=10).status_code == 200
    code, _, stderr = served.stop(signal.SIGTERM)
    assert code == 0, stderr
    assert "http h11" in (logs / f"{NAME}.log").read_text()
