"""A conversational server through the paths a user has: ``gym.make``, the vector env, ``nemo-gym-env rollouts``
(the scripted agent, a failing user model), a model user from ``server_config``, and a score that is not a
reward. The embedded model on both sides and a GRPO step are in tests/conversation/test_docs.py (the page's
commands). The bundled ``retail_support`` is the server; the TRL route is in tests/adapters/trl/test_rollout.py,
MCP in tests/server/test_mcp_expose.py, the viewer in tests/viewer/test_browser.py."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import pytest

import nemo_gym_env  # noqa: F401 - registers the envs
from nemo_gym_env.conversation import ConversationServer, ToolError
from nemo_gym_env.rollouts.output import failures_path
from nemo_gym_env.server.testing import app_client, assistant_message, play_episode
from nemo_gym_env.servers.retail_support import scripted
from tests.cli.conftest import read_jsonl, run_cli

SERVER = "retail_support"
USER = f"++{SERVER}.resources_servers.{SERVER}"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    from tests.fixtures.openai_server import running_server

    with running_server() as url:
        yield url


def test_gym_make_shows_the_users_reply_after_a_step():
    env = gym.make(f"NemoGym/{SERVER}-v0")
    try:
        observation, _ = env.reset(options={"task_index": 0})
        row = env.unwrapped.task
        assert observation[-1] == {"type": "message", "role": "user", "content": row["user"]["opening"]}
        observation, reward, terminated, _, _ = env.step("Could you tell me the email on your account?")
        assert observation == [{"type": "message", "role": "user", "content": row["user"]["details"][0]["say"]}]
        assert reward == 0.0 and not terminated
        reward, terminated, truncated, info = play_episode(env, scripted.scripted_action, options={"task_index": 2})
        assert terminated and not truncated and reward == 1.0 and info["reward"] == 1.0
        row = env.unwrapped.last_verify
        assert row["info"]["user_turns"] >= 2 and row["user_usage"] == {"input_tokens": 0, "output_tokens": 0}
    finally:
        env.close()


def test_the_vector_env_plays_conversations_side_by_side():
    envs = gym.make_vec(f"NemoGym/{SERVER}-v0", num_envs=3)
    try:
        observations, _ = envs.reset(options={"task_indices": [0, 1, 2]})
        histories: list[list] = [[], [], []]
        rows = [episode.task for episode in envs.unwrapped.episodes]
        returns = [None, None, None]
        for _ in range(12):
            live = envs.unwrapped.live_mask
            actions = [None if not live[i] else scripted.scripted_action(rows[i], histories[i]) if returns[i] is None
                       else "Goodbye." for i in range(3)]
            observations, rewards, terminations, _, _ = envs.step(actions)
            for i in range(3):
                if returns[i] is None:
                    histories[i].extend(observations[i])
                    if terminations[i]:
                        returns[i] = float(rewards[i])
            if all(r is not None for r in returns):
                break
        assert returns == [1.0, 1.0, 1.0]
    finally:
        envs.close()


def test_rollouts_with_the_scripted_agent_score_one_and_the_user_speaks(tmp_path):
    out = tmp_path / "rows.jsonl"
    result = run_cli("rollouts", SERVER, "--policy", "scripted", "-o", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_jsonl(out)
    assert len(rows) == 6 and all(row["reward"] == 1.0 for row in rows)
    for row in rows:
        said = row["info"]["conversation"]
        assert row["info"]["user_turns"] >= 2 and said[0]["role"] == "user" and said[-1]["role"] == "user"
        heard = [item["content"] for item in row["response"]["output"] if item.get("role") == "user"]
        assert heard == [line["text"] for line in said[1:-1] if line["role"] == "user"]  # the last ends the talk
        assert row["user_usage"] == {"input_tokens": 0, "output_tokens": 0}


def test_a_user_model_that_fails_makes_failure_rows_never_rewards(tmp_path, endpoint):
    out = tmp_path / "rows.jsonl"
    result = run_cli("rollouts", SERVER, "--policy", "scripted", "--limit", "2", "-o", str(out), f"{USER}.user=policy",
                     f"{USER}.user_timeout_s=1",
                     f"{USER}.user_policy={{kind: openai, model: hang-u, base_url: '{endpoint}', api: chat}}")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert read_jsonl(out) == []
    failures = read_jsonl(failures_path(out))
    assert len(failures) == 2, failures
    for failure in failures:
        assert failure["_ng_failure_class"] == "server_error" and "reward" not in failure
        assert "/step" in failure["failure_reason"] and "HTTP 502" in failure["failure_reason"]
        assert "user: the user model did not answer within 1 s" in failure["failure_reason"]


class _Broken(ConversationServer):
    def start(self, row):
        return {}

    def call_tool(self, state, name, arguments):
        raise ToolError("none")

    def score(self, state, row, talk):
        return {"state": 2.0}


def test_a_score_outside_zero_to_one_is_a_server_error_not_a_reward():
    row = {"responses_create_params": {"input": []}, "user": {"opening": "Hi.", "done_by": ["bye"]}}
    with app_client(_Broken, {}, name="broken") as client:
        assert client.post("/reset", json=row).status_code == 200
        from nemo_gym_env.protocol.types import make_response

        reply = client.post("/step", json={**row, "response": make_response([assistant_message("bye")]).model_dump(
            mode="json")})
        assert reply.status_code == 500 and "outside [0, 1]: state" in reply.text


def test_gym_make_takes_the_user_from_server_config(endpoint):
    """``server_config`` overrides the bundled server's YAML (here: a model plays the customer) in a server of its
    own; the plain env keeps the scripted customer."""
    user = {"user": "policy", "user_policy": {"kind": "openai", "model": "customer", "base_url": endpoint, "api": "chat"}}
    modelled, plain = gym.make(f"NemoGym/{SERVER}-v0", server_config=user), gym.make(f"NemoGym/{SERVER}-v0")
    try:
        assert modelled.unwrapped.base_url != plain.unwrapped.base_url
        for env in (modelled, plain):
            env.reset(options={"task_index": 0})
        heard = [env.step("What is your email?")[0][0]["content"] for env in (modelled, plain)]
        assert heard[1] == plain.unwrapped.task["user"]["details"][0]["say"] and heard[0] != heard[1] and heard[0]
    finally:
        modelled.close()
        plain.close()
