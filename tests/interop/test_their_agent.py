"""Our servers, their agent: NeMo Gym's simple_agent and ``ng_collect_rollouts`` play our bundled
servers (started by our launcher), with NeMo Gym's model server in front of a scripted
OpenAI-compatible model, and write the rewards our servers give.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import gymnasium as gym
import pytest

import nemo_gym_env  # noqa: F401  (registers the ids)
from nemo_gym_env.protocol.metrics import numeric_fields

from .conftest import (
    CHAT_AGENT_SERVER,
    SHARED_SERVERS,
    NgStack,
    agent_name,
    chat_agent_name,
    our_player,
    our_rows,
)
from .ngstack import read_jsonl
from .players import play_episode
from .scripted_model import scripted_metadata

pytestmark = [pytest.mark.interop, pytest.mark.timeout(900)]  # the first test also starts ng_run

AGENTS = {**{agent_name(s): s for s in SHARED_SERVERS}, chat_agent_name(CHAT_AGENT_SERVER): CHAT_AGENT_SERVER}
"""NeMo Gym agent instance -> our server it plays."""


def _rollout_inputs() -> list[dict[str, Any]]:
    """Every example row of our three servers, played correctly and wrongly, for NeMo Gym's agents."""
    rows = []
    for agent, server in AGENTS.items():
        for task_index, row in enumerate(our_rows(server)):
            for correct in (True, False):
                variant = copy.deepcopy(row)
                variant["responses_create_params"]["metadata"] = scripted_metadata(server, task_index, correct)
                variant["agent_ref"] = {"type": "responses_api_agents", "name": agent}
                rows.append(variant)
    return rows


def _trajectory(output: list[dict[str, Any]]) -> list[tuple]:
    """What the model did and the server answered, without ids or formatting."""
    steps = []
    for item in output:
        kind = item.get("type", "message")
        if kind == "function_call":
            steps.append((kind, item["call_id"], item["name"], item["arguments"]))
        elif kind == "function_call_output":
            steps.append((kind, item["call_id"], item["output"]))
        elif kind == "message":
            steps.append((kind, "".join(part.get("text", "") for part in item["content"])))
    return steps


@pytest.fixture(scope="module")
def rollouts(ng_stack: NgStack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``ng_collect_rollouts`` over :func:`_rollout_inputs`: its rollouts and aggregate metrics."""
    folder = tmp_path_factory.mktemp("rollouts")
    inputs = _rollout_inputs()
    input_path, output_path = folder / "inputs.jsonl", folder / "rollouts.jsonl"
    input_path.write_text("".join(json.dumps(row) + "\n" for row in inputs))
    before = len(ng_stack.model.requests)
    proc = ng_stack.run.run_cli(
        "ng_collect_rollouts",
        f"+input_jsonl_fpath={input_path}",
        f"+output_jsonl_fpath={output_path}",
        "+num_samples_in_parallel=4",
    )
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{ng_stack.run.log_tail()}"
    metrics_path = output_path.with_name("rollouts_aggregate_metrics.json")
    return {
        "inputs": inputs,
        "results": read_jsonl(output_path),
        "metrics": json.loads(metrics_path.read_text()),
        "model_requests": ng_stack.model.requests[before:],
        "failures": output_path.with_name("rollouts_failures.jsonl"),
    }


def test_rollouts_have_our_rewards(rollouts: dict[str, Any]) -> None:
    results = rollouts["results"]
    assert len(results) == len(rollouts["inputs"]) == sum(2 * len(our_rows(s)) for s in AGENTS.values())
    assert not rollouts["failures"].exists() or not rollouts["failures"].read_text().strip()
    for result in results:
        play = result["responses_create_params"]["metadata"]["scripted_play"]
        assert result["reward"] == (1.0 if play == "correct" else 0.0), result
        assert isinstance(result["_ng_task_index"], int) and result["_ng_rollout_index"] == 0
        assert result["agent_ref"]["name"].endswith("_agent")
        types = [item.get("type") for item in result["response"]["output"]]
        assert types[-1] == "message"  # the simple agent stops at a turn without tool calls
        # The model servers' usage (summed by the agent) reached our /verify and came back:
        # written by openai<=2.7.2, without the cache_write_tokens newer SDKs require.
        usage = result["response"]["usage"]
        assert usage["total_tokens"] > 0 and usage["input_tokens_details"]["cached_tokens"] == 0
    # Both model server kinds were driven: Responses (openai_model) and Chat Completions (vllm_model).
    routes = {request["route"] for request in rollouts["model_requests"]}
    assert routes == {"/v1/responses", "/v1/chat/completions"}


def test_rollouts_match_our_env_step_for_step(ng_stack: NgStack, rollouts: dict[str, Any]) -> None:
    """The same rows and moves through our Env give the same reward, metrics and tool outputs."""
    envs = {s: gym.make("NemoGym/Generic-v0", base_url=ng_stack.our_urls[s], dataset=our_rows(s)) for s in SHARED_SERVERS}
    try:
        for result in rollouts["results"]:
            metadata = result["responses_create_params"]["metadata"]
            server, task_index = metadata["scripted_server"], int(metadata["scripted_task"])
            env = envs[server]
            ours = play_episode(env, our_player(server), correct=metadata["scripted_play"] == "correct",
                                options={"task_index": task_index})
            assert result["reward"] == ours["reward"]
            theirs_metrics = numeric_fields(result)
            ours_metrics = numeric_fields(ours["verify"])
            assert theirs_metrics == ours_metrics, (server, task_index)
            ours_steps = _trajectory(env.unwrapped.response.model_dump(mode="json")["output"])
            theirs_steps = _trajectory(result["response"]["output"])
            assert theirs_steps == ours_steps, (server, task_index)
    finally:
        for env in envs.values():
            env.close()


def test_aggregate_metrics_through_their_agent(rollouts: dict[str, Any]) -> None:
    """ng_collect_rollouts asks each agent for /aggregate_metrics, which proxies to our server's."""
    by_agent = {entry["agent_ref"]["name"]: entry for entry in rollouts["metrics"]}
    assert set(by_agent) == set(AGENTS)
    for name, entry in by_agent.items():
        assert entry["agent_metrics"]["mean/reward"] == pytest.approx(0.5), name
        assert entry["key_metrics"]["mean/reward"] == pytest.approx(0.5), name
        assert len(entry["group_level_metrics"]) == 2 * len(our_rows(AGENTS[name])), name
