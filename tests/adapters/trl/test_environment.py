"""The ``environment_factory`` route: tool classes built from the servers' tool schemas."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")
from transformers.utils import get_json_schema

import nemo_gym_env  # noqa: F401
from nemo_gym_env.adapters.trl import env_rows, nemo_gym_environment, tasks_dataset

from ..conftest import secret_rows, secret_spec, verify_log


def schemas(cls: type) -> dict[str, dict]:
    """What TRL builds from the class: the JSON schema of every public method but reset/get_reward."""
    instance = cls()
    names = [n for n in dir(cls) if not n.startswith("_") and n not in ("reset", "get_reward", "close")]
    return {name: get_json_schema(getattr(instance, name))["function"] for name in names}


@pytest.mark.parametrize("server", ["example_single_tool_call", "example_multi_step", "example_session_state_mgmt"])
def test_tool_methods_round_trip_the_servers_schemas(server):
    Env = nemo_gym_environment(f"NemoGym/{server}-v0")
    tools = {t["name"]: t for t in env_rows(server)[0]["responses_create_params"]["tools"]}
    found = schemas(Env)
    assert set(found) == set(tools)
    for name, schema in found.items():
        original = tools[name]
        assert schema["description"] == " ".join(original["description"].split())
        properties = original["parameters"].get("properties", {})
        assert set(schema["parameters"]["properties"]) == set(properties)
        assert sorted(schema["parameters"].get("required", [])) == sorted(original["parameters"].get("required", []))
        for arg, spec in properties.items():
            got = schema["parameters"]["properties"][arg]
            assert got["type"] == spec["type"] and got["description"] == spec["description"]
            if spec["type"] == "array":
                assert got["items"] == {"type": spec["items"]["type"]}


def test_optional_enum_and_odd_names_become_valid_signatures():
    tool = {"type": "function", "name": "set-mode", "description": "Pick a mode.\n  Returns ok.", "strict": False,
            "parameters": {"type": "object", "required": ["mode"], "properties": {
                "mode": {"type": "string", "enum": ["fast", "slow"], "description": "Which mode."},
                "level": {"type": ["integer", "null"]},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels."}}}}
    row = {"responses_create_params": {"input": "hi", "tools": [tool]}}
    schema = schemas(nemo_gym_environment("NemoGym/Generic-v0", dataset=[row]))["set_mode"]
    assert schema["description"] == "Pick a mode. Returns ok."
    props = schema["parameters"]["properties"]
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"], "description": "Which mode."}
    assert props["level"]["type"] == "integer" and props["level"].get("nullable") is True
    assert props["tags"]["items"] == {"type": "string"}
    assert schema["parameters"]["required"] == ["mode"]


def test_episode_reset_tools_with_cookies_and_verify(secret_server):
    rows = secret_rows()
    dataset = tasks_dataset(rows)
    Env = nemo_gym_environment("NemoGym/Generic-v0", base_url=secret_server, dataset=rows)
    try:
        first, second = Env(), Env()
        assert first.reset(**dataset[0]) is None and second.reset(**dataset[1]) is None
        # Each instance reaches its own session: the server answers from the seeded words.
        assert json.loads(first.get_word(n=3)) == {"word": "plum"}
        assert json.loads(second.get_word(n=3)) == {"word": "date"}
        assert "error" in json.loads(first.get_word(n=9))
        before = len(verify_log(secret_server))
        reward = first.get_reward()
        assert reward is not None and reward < 1.0  # no final answer reaches the verifier on this route
        assert verify_log(secret_server)[before:] == [reward]
        assert first.get_reward() == reward  # verified once
        # Verified as it stood: the two calls and their outputs, no made-up assistant message after them.
        assert [i["type"] for i in first._episode.trajectory] == [
            "function_call", "function_call_output", "function_call", "function_call_output"]
        assert "episode has ended" in first.get_word(n=1)
        # A reset starts a fresh episode on the same instance (TRL reuses instances).
        first.reset(**dataset[1])
        assert json.loads(first.get_word(n=1)) == {"word": "lime"}
    finally:
        Env.close()


def test_dead_server_gives_error_outputs_and_no_reward():
    from nemo_gym_env.launch.launcher import Launcher

    rows = secret_rows()
    with Launcher() as launcher:
        process = launcher.start(secret_spec())
        Env = nemo_gym_environment("NemoGym/Generic-v0", base_url=process.url, dataset=rows)
        env = Env()
        env.reset(**tasks_dataset(rows)[0])
        launcher.stop(process.name)
        assert "error" in json.loads(env.get_word(n=3))
        assert env.get_reward() is None
        env.reset(**tasks_dataset(rows)[0])
        assert "error" in json.loads(env.get_word(n=1)) and env.get_reward() is None
        Env.close()
