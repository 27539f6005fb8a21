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


PLACEHOLDER = [{"role": "user", "content": ""}]
"""The prompt of TRL's stand-in rows when a trainer has no train_dataset."""


def test_without_a_task_the_environment_draws_one_per_group_and_returns_its_text(secret_server):
    rows = secret_rows()
    Env = nemo_gym_environment("NemoGym/Generic-v0", base_url=secret_server, dataset=rows, num_generations=2, seed=5)
    try:
        envs = [Env() for _ in range(8)]
        texts = [env.reset(prompt=PLACEHOLDER) for env in envs]
        tasks = [env._episode.task for env in envs]
        # Copies of a group (num_generations resets in a row) play the same task; the text is that task's.
        assert all(tasks[k] == tasks[k + 1] and texts[k] == texts[k + 1] for k in range(0, 8, 2))
        assert {json.dumps(t) for t in tasks} <= {json.dumps(r) for r in rows}
        assert len({json.dumps(t) for t in tasks}) == 2  # both tasks drawn in 4 groups (seed 5)
        for text, task in zip(texts, tasks):
            assert text.endswith("Get secret word 4.") and task["words"][0] in text  # its own few-shot words
        # The episode is live on that task: the server's session holds the drawn task's words.
        assert json.loads(envs[0].get_word(n=1)) == {"word": tasks[0]["words"][0]}
        # A multi-environment row without a prompt column resets with no arguments at all: drawn as well.
        assert envs[1].reset() is not None
        # A dataset row still plays its own task and adds nothing to the prompt.
        assert envs[2].reset(**tasks_dataset(rows)[1]) is None and envs[2]._episode.task == rows[1]
    finally:
        Env.close()
    with pytest.raises(ValueError, match="num_generations"):
        nemo_gym_environment("NemoGym/example_single_tool_call-v0", num_generations=0)


def test_draws_repeat_for_a_seed():
    def draws(seed):
        Env = nemo_gym_environment("NemoGym/example_single_tool_call-v0", num_generations=1, seed=seed)
        return [Env._draw(5) for _ in range(12)]

    assert draws(1) == draws(1) and draws(1) != draws(2)


def _child_plays(Env, row, queue):
    """In a spawned process (as AsyncGRPOTrainer's rollout worker is): reset, call a tool, get the reward."""
    env = Env()
    env.reset(task=row)
    queue.put((type(env).__name__, env.get_word(n=2), env.get_reward()))
    Env.close()


def test_the_class_pickles_into_a_spawned_process_and_plays_there(secret_server):
    import multiprocessing
    import pickle

    rows = secret_rows()
    Env = nemo_gym_environment("NemoGym/Generic-v0", base_url=secret_server, dataset=rows)
    assert pickle.loads(pickle.dumps(Env)) is Env  # the same class again in this process
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    before = len(verify_log(secret_server))
    child = context.Process(target=_child_plays, args=(Env, tasks_dataset(rows)[0]["task"], queue))
    child.start()
    try:
        name, output, reward = queue.get(timeout=120)
    finally:
        child.join(timeout=30)
    assert child.exitcode == 0
    assert name == Env.__name__ and json.loads(output) == {"word": "pear"}
    assert verify_log(secret_server)[before:] == [reward]


def test_nemo_gym_environments_builds_one_class_per_mixture_entry(secret_server):
    from nemo_gym_env.adapters.trl import mixture_dataset, nemo_gym_environments
    from nemo_gym_env.errors import ConfigError

    envs = {"NemoGym/Generic-v0": {"weight": 1, "base_url": secret_server, "dataset": secret_rows()},
            "NemoGym/example_single_tool_call-v0": 1, "NemoGym/mcqa-v0": 0}
    factories = nemo_gym_environments(envs)
    assert list(factories) == ["NemoGym/Generic-v0", "NemoGym/example_single_tool_call-v0"]  # weight 0 left out
    assert set(schemas(factories["NemoGym/Generic-v0"])) == {"get_word"}
    assert set(schemas(factories["NemoGym/example_single_tool_call-v0"])) == {"get_weather"}
    dataset = mixture_dataset(envs, 6, seed=0)
    assert sorted(set(dataset["environment"])) == sorted(factories)
    try:
        for row in dataset:  # what TRL does in multi-environment mode: reset with the row minus `environment`
            env = factories[row["environment"]]()
            assert env.reset(**{k: v for k, v in row.items() if k != "environment"}) is None
            assert env._episode.task == json.loads(row["task"])
    finally:
        for cls in factories.values():
            cls.close()
    with pytest.raises(ConfigError, match="unknown env id"):
        nemo_gym_environments({"NemoGym/nope-v0": 1})
