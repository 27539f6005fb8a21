"""``nemo-gym-env play`` as a real process: episodes played over HTTP through the env a policy uses."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from nemo_gym_env.envs.registration import env_id
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers, bundled_spec
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.rollouts.output import read_rollouts
from nemo_gym_env.system.redaction import REDACTED
from tests.cli.conftest import assert_one_line_error, run_cli
from tests.conftest import example_rows
from tests.viewer.conftest import running_cli

SECRET = "sk-playtest-0123456789abcdefghijk"

pytestmark = pytest.mark.slow  # real processes on loopback


@pytest.fixture(scope="module")
def play(tmp_path_factory):
    folder = tmp_path_factory.mktemp("play")
    (folder / "env.yaml").write_text(f"policy_api_key: {SECRET}\n")
    with running_cli("play", "example_multi_step", "--output", "out/played.jsonl", "--max-steps", "8",
                     cwd=folder) as running:
        running.folder = folder
        yield running


def _start(play, task_index=0) -> dict:
    reply = play.post("/api/sessions", {"task_index": task_index})
    assert reply.status_code == 200, reply.text
    return reply.json()


def _step(play, session, body) -> dict:
    reply = play.post(f"/api/sessions/{session}/step", body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _call(name, arguments):
    return {"calls": [{"name": name, "arguments": arguments}]}


def _solve(play, task_index: int, *, correct: bool = True) -> tuple[dict, dict]:
    """Play a multi-step task as a person would: look up each synonym, submit the values, answer."""
    episode = _start(play, task_index)
    synonyms = example_rows("example_multi_step")[task_index]["expected_synonyms"]
    values = []
    for synonym in synonyms:
        reply = _step(play, episode["session"], _call("get_synonym_value", {"synonym": synonym}))
        assert reply["items"][0]["name"] == "get_synonym_value" and not reply["terminated"]
        values.append(json.loads(reply["observation"][0]["output"])["synonym_value"])
    _step(play, episode["session"], _call("extract_synonym_values", {"synonym_values": values if correct else values[::-1]}))
    return episode, _step(play, episode["session"], {"message": "I submitted the values."})


def test_info_names_the_server_and_its_tasks(play):
    info = play.get("/api/info").json()
    assert info["server"] == "example_multi_step" and info["num_tasks"] == len(example_rows("example_multi_step"))
    assert info["output"] == "out/played.jsonl" and info["max_steps"] == 8
    assert [t["index"] for t in info["tasks"]] == list(range(info["num_tasks"]))
    assert "pizza" in info["tasks"][0]["preview"]


def test_the_page_gets_what_a_policy_gets(play):
    episode = _start(play, 2)
    env = gym.make(env_id("example_multi_step"))
    try:
        observation, info = env.reset(options={"task_index": 2})
    finally:
        env.close()
    assert episode["observation"] == observation
    assert episode["tools"] == info["tools"] and episode["sampling"] == info["sampling"]
    assert episode["task_index"] == 2 and episode["max_steps"] == 8


def test_an_episode_played_by_hand_scores_1_and_is_saved_once(play):
    episode, final = _solve(play, 1)
    assert final["terminated"] and final["reward"] == 1.0
    assert final["verify"]["reward"] == 1.0 and final["verify"]["accuracy"] is True
    assert final["items"][0]["type"] == "message" and final["observation"] == []
    where = play.post(f"/api/sessions/{episode['session']}/save").json()
    assert where == {"path": "out/played.jsonl", "task_index": 1, "rollout_index": 0}
    assert play.post(f"/api/sessions/{episode['session']}/save").json() == where  # saving twice writes once
    again, final = _solve(play, 1, correct=False)
    assert final["reward"] == 0.0 and final["verify"]["order_instruction_following_failure"] is True
    assert play.post(f"/api/sessions/{again['session']}/save").json()["rollout_index"] == 1
    rows, torn = read_rollouts(play.folder / "out" / "played.jsonl")
    assert torn == 0 and [(r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in rows] == [
        (1, 0, 1.0), (1, 1, 0.0)]
    assert rows[0]["agent_ref"] == {"type": "resources_servers", "name": "example_multi_step"}
    synonyms = example_rows("example_multi_step")[1]["expected_synonyms"]
    assert [i["type"] for i in rows[0]["response"]["output"]].count("function_call") == len(synonyms) + 1
    # The row the rollouts command would write: the server's step rewards (0.1 a new lookup) included.
    assert rows[0]["step_rewards"][:len(synonyms)] == pytest.approx([0.1] * len(synonyms))
    assert rows[0]["step_reward_sum"] == pytest.approx(0.1 * len(synonyms)) and rows[0]["reward"] == 1.0


def test_a_turn_a_model_gets_wrong_gets_the_answer_a_model_would(play):
    session = _start(play)["session"]
    unknown = _step(play, session, _call("no_such_tool", {}))
    tools = "its tools are: get_synonym_value, extract_synonym_values"
    assert json.loads(unknown["observation"][0]["output"]) == {
        "error": f"Unknown tool 'no_such_tool': not a tool of this environment; {tools}"}
    reserved = _step(play, session, _call("verify", {}))
    assert json.loads(reserved["observation"][0]["output"]) == {
        "error": f"Unknown tool 'verify': not a tool of this environment; {tools}"}
    garbled = _step(play, session, _call("get_synonym_value", '{"synonym": "Famished"'))  # typed, not JSON
    assert "Invalid tool call arguments" in garbled["observation"][0]["output"]
    rejected = _step(play, session, _call("get_synonym_value", {"word": 3}))
    assert not rejected["terminated"] and "synonym" in rejected["observation"][0]["output"]


def test_the_step_limit_verifies_and_truncates(play):
    session = _start(play)["session"]
    for _ in range(7):
        assert not _step(play, session, _call("get_synonym_value", {"synonym": "Wee"}))["truncated"]
    last = _step(play, session, _call("get_synonym_value", {"synonym": "Wee"}))
    assert last["truncated"] and not last["terminated"] and last["verify"]["reward"] == 0.0


@pytest.mark.parametrize(("method", "path", "body", "status", "message"), [
    ("post", "/api/sessions", {"task_index": 99}, 422, "there are 5 tasks"),
    ("post", "/api/sessions", {"task_index": "zero"}, 422, "task_index"),
    ("post", "/api/sessions", {"task": 0}, 422, "task"),
    ("post", "/api/sessions/nope/step", {"message": "hi"}, 404, "no such episode"),
    ("post", "/api/sessions/nope/save", {}, 404, "no such episode"),
])
def test_bad_requests_get_clear_errors(play, method, path, body, status, message):
    reply = getattr(play, method)(path, body)
    assert reply.status_code == status and message in reply.json()["error"]


def test_turns_out_of_order_are_refused(play):
    session = _start(play)["session"]
    assert play.post(f"/api/sessions/{session}/step", {}).status_code == 422
    early = play.post(f"/api/sessions/{session}/save")
    assert early.status_code == 409 and "finish the episode" in early.json()["error"]
    _step(play, session, {"message": "no idea"})
    late = play.post(f"/api/sessions/{session}/step", {"message": "again"})
    assert late.status_code == 409 and "over" in late.json()["error"]
    with play.client() as client:  # a form post from another site cannot reach it
        form = client.post("/api/sessions", content=b"task_index=0", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415


def test_old_episodes_make_room_for_new_ones(play):
    first = _start(play)["session"]
    for _ in range(16):
        _start(play)
    assert play.post(f"/api/sessions/{first}/step", {"message": "hi"}).status_code == 404


@pytest.fixture(scope="module")
def weather_server():
    with Launcher() as launcher:
        yield launcher.start(bundled_spec("example_single_tool_call")).url


def _tasks_with(tmp_path, text: str):
    rows = example_rows("example_single_tool_call")[:2]
    rows[0]["responses_create_params"]["input"][-1]["content"] = text
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_plays_a_running_server_by_url_and_serves_no_secret(tmp_path, weather_server):
    (tmp_path / "env.yaml").write_text(f"policy_api_key: {SECRET}\n")
    tasks = _tasks_with(tmp_path, f"My key is {SECRET}; do I need gloves in Oslo?")
    with running_cli("play", "example_single_tool_call", "--server-url", weather_server, "--input", str(tasks),
                     cwd=tmp_path) as running:
        info = running.get("/api/info").json()
        assert info["server"] == "example_single_tool_call" and info["num_tasks"] == 2
        episode = running.post("/api/sessions", {"task_index": 0})
        assert SECRET not in episode.text and f"My key is {REDACTED}" in episode.text
        session = episode.json()["session"]
        called = running.post(f"/api/sessions/{session}/step", _call("get_weather", {"city": SECRET})).json()
        assert "weather_description" in called["observation"][0]["output"]
        final = running.post(f"/api/sessions/{session}/step", {"message": "Yes, gloves."})
        assert final.json()["reward"] == 1.0 and SECRET not in final.text
        assert SECRET not in running.get("/api/info").text


def test_plays_a_server_launched_from_its_config(tmp_path):
    config = bundled_servers()["example_single_tool_call"] / "configs" / "example_single_tool_call.yaml"
    with running_cli("play", f"+config_paths=[{config}]", "--input", str(bundled_dataset("example_single_tool_call")),
                     cwd=tmp_path) as running:
        assert running.get("/api/info").json()["server"] == "example_single_tool_call"
        session = running.post("/api/sessions", {"task_index": 1}).json()["session"]
        running.post(f"/api/sessions/{session}/step", _call("get_weather", {"city": "Lima"}))
        assert running.post(f"/api/sessions/{session}/step", {"message": "Cold."}).json()["reward"] == 1.0


def test_plays_a_server_folder_and_a_hosted_env_by_name(tmp_path):
    """A folder as ``init`` writes it and a ``gymnasium:`` target are names, as a bundled server's is."""
    from nemo_gym_env.server.scaffold import init_server

    init_server("my_env", tmp_path)
    with running_cli("play", "./my_env", cwd=tmp_path) as running:
        info = running.get("/api/info").json()
        assert info["server"] == "my_env" and info["num_tasks"] == 5  # the folder's data/example.jsonl
        session = running.post("/api/sessions", {"task_index": 0}).json()["session"]
        added = running.post(f"/api/sessions/{session}/step", _call("add", {"a": 2, "b": 3})).json()
        assert json.loads(added["observation"][0]["output"]) == {"sum": 5}
    with running_cli("play", "gymnasium:FrozenLake-v1", cwd=tmp_path) as running:
        info = running.get("/api/info").json()
        assert info["server"] == "gymnasium_FrozenLake-v1" and info["num_tasks"] > 0


@pytest.mark.parametrize(("args", "says"), [
    ((), "name a server to play"),
    (("no_such_server",), "no bundled server named 'no_such_server'"),
    (("example_multi_step", "example_single_tool_call"), "play one server"),
    (("--server-url", "http://127.0.0.1:9"), "need the tasks: --input"),
    (("--server-url", "127.0.0.1:9", "--input", "tasks.jsonl"), "--server-url must be an http://"),
    (("example_multi_step", "+head_server.port=0"), "not '+head_server.port=0'"),
    (("example_multi_step", "--input", "missing.jsonl"), "dataset 'missing.jsonl' not found"),
    (("example_multi_step", "--max-steps", "0"), "--max-steps must be >= 1"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, args, says):
    (tmp_path / "tasks.jsonl").write_bytes(bundled_dataset("example_single_tool_call").read_bytes())
    result = run_cli("play", *args, cwd=tmp_path)
    assert_one_line_error(result)
    assert says in result.stderr
