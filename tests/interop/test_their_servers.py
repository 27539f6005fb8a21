"""Their servers, our Env: NeMo Gym's own resources servers, started by NeMo Gym's ``ng_run``,
played through ``gym.make("NemoGym/Generic-v0", base_url=..., dataset=<their example.jsonl>)``.
"""

from __future__ import annotations

import json

import gymnasium as gym
import httpx
import pytest

import nemo_gym_env  # noqa: F401  (registers the ids)

from .conftest import FIXTURE_SERVER, THEIR_SERVERS, NgStack, read_rows, their_rows_path
from .players import PLAYERS, play_episode

pytestmark = [pytest.mark.interop, pytest.mark.timeout(900)]  # the first test also starts ng_run


def _dataset(stack: NgStack, server: str) -> str:
    if server == "ng_style_server":
        return str(FIXTURE_SERVER / "data" / "example.jsonl")
    return str(their_rows_path(stack.site_packages, server))


def _expected_reward(server: str, correct: bool) -> float:
    # NeMo Gym's example_single_tool_call rewards every episode 1.0, tool call or not.
    return 1.0 if correct or server == "example_single_tool_call" else 0.0


@pytest.mark.parametrize("correct", [True, False], ids=["correct", "wrong"])
@pytest.mark.parametrize("server", [*THEIR_SERVERS, "ng_style_server"])
def test_their_server_through_our_env(ng_stack: NgStack, server: str, correct: bool) -> None:
    env = gym.make("NemoGym/Generic-v0", base_url=ng_stack.their_urls[server], dataset=_dataset(ng_stack, server))
    try:
        rows = env.unwrapped.rows
        assert len(rows) >= 4
        for task_index in range(len(rows)):
            result = play_episode(env, PLAYERS[server], correct=correct, options={"task_index": task_index})
            row, verify = env.unwrapped.task, result["verify"]
            assert result["terminated"] and not result["truncated"], result["info"]
            assert result["reward"] == _expected_reward(server, correct), verify
            assert verify["reward"] == result["reward"]
            # The verify reply echoes the row (their BaseVerifyResponse) and the whole episode.
            echoed = verify["responses_create_params"]["input"]
            assert [(m["role"], m["content"]) for m in echoed] == [
                (m["role"], m["content"]) for m in row["responses_create_params"]["input"]
            ]
            assert [i["type"] for i in verify["response"]["output"]] == [
                i["type"] for i in env.unwrapped.response.model_dump(mode="json")["output"]
            ]
            if server == "example_multi_step":
                assert verify["accuracy"] is correct
                # The values looked up through their tool are the row's ground truth.
                lookups = [json.loads(o) for o in result["observations"] if "synonym_value" in o]
                assert [o["synonym_value"] for o in lookups] == row["expected_synonym_values"]
            if server == "mcqa":
                assert verify["expected_answer"] == row["expected_answer"]
                assert (verify["extracted_answer"] == row["expected_answer"]) is correct
            if server == "example_session_state_mgmt":
                # The count read back went through the session cookie: initial + increments.
                final = result["observations"][-1]
                assert (final == f'{{"count":{row["expected_count"]}}}') is correct
            if server == "ng_style_server":
                assert (sorted(verify["final_items"]) == sorted(row["expected_items"])) is correct
    finally:
        env.close()


def test_their_session_cookie_carries_state(ng_stack: NgStack) -> None:
    """NeMo Gym's session server keys state by the signed cookie; our client carries it.

    Without the cookie, each call is a new session: the counter reads 0 and verify gives 0.
    """
    url = ng_stack.their_urls["example_session_state_mgmt"]
    row = read_rows(their_rows_path(ng_stack.site_packages, "example_session_state_mgmt"))[0]

    def post(route: str, body: dict, cookie: str | None = None) -> httpx.Response:
        # A fresh client per call: only the cookie passed here is sent.
        return httpx.post(url + route, json=body, headers={"cookie": cookie} if cookie else {}, timeout=30)

    seeded = post("/seed_session", row)
    assert seeded.status_code == 200
    [set_cookie] = seeded.headers.get_list("set-cookie")
    cookie = set_cookie.split(";", 1)[0]
    assert cookie.split("=", 1)[0] == "StatefulCounterResourcesServer___example_session_state_mgmt_resources_server"
    delta = row["expected_count"] - row["initial_count"]
    assert post("/increment_counter", {"count": delta}, cookie).json() == {"success": True}
    assert post("/get_counter_value", {}, cookie).json() == {"count": row["expected_count"]}
    assert post("/get_counter_value", {}).json() == {"count": 0}  # no cookie: a new session

    env = gym.make("NemoGym/Generic-v0", base_url=url, dataset=[row])
    try:
        env.reset(seed=0)
        env.step([{"type": "function_call", "call_id": "c1", "name": "increment_counter",
                   "arguments": f'{{"count": {delta}}}'}])
        episode = env.unwrapped.episode
        saved, episode.cookies = episode.cookies, {}  # drop the cookie before verify
        _, reward, terminated, _, _ = env.step("done")
        assert saved and terminated and reward == 0.0
    finally:
        env.close()


def test_their_sessions_are_isolated_between_interleaved_episodes(ng_stack: NgStack) -> None:
    """Two envs on the same NeMo Gym server, steps interleaved: each keeps its own counter."""
    url = ng_stack.their_urls["example_session_state_mgmt"]
    dataset = str(their_rows_path(ng_stack.site_packages, "example_session_state_mgmt"))
    player = PLAYERS["example_session_state_mgmt"]
    envs = [gym.make("NemoGym/Generic-v0", base_url=url, dataset=dataset) for _ in range(2)]
    try:
        histories: list[list] = [[], []]
        for env, index in zip(envs, (1, 3)):
            env.reset(options={"task_index": index})
        results = [None, None]
        for _ in range(3):
            for k, env in enumerate(envs):
                if results[k] is None:
                    obs, reward, terminated, truncated, _ = env.step(player(env.unwrapped.task, histories[k]))
                    histories[k].extend(obs)
                    if terminated or truncated:
                        results[k] = reward
        assert results == [1.0, 1.0]
    finally:
        for env in envs:
            env.close()
