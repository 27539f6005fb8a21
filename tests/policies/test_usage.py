"""Token usage: each policy turn's counts, summed per episode into the verify body's ``response.usage``."""

from __future__ import annotations

import pytest

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.episode import Episode
from nemo_gym_env.launch.catalog import bundled_dataset
from nemo_gym_env.policies import OpenAIPolicy, ScriptedPolicy
from nemo_gym_env.protocol.dataset import load_rows
from nemo_gym_env.rollouts.jobs import collect

SERVER = "example_single_tool_call"
ROWS = load_rows(bundled_dataset(SERVER))[:2]


def _rows(policy, url: str) -> list[dict]:
    async def run() -> list[dict]:
        return [row async for row in collect(ROWS, policy, url, server_name=SERVER)]
    return background_loop().run(run())


def test_add_usage_sums_and_checks_its_input():
    episode = Episode(ResourcesClient("http://127.0.0.1:9"), {"responses_create_params": {"input": "hi"}}, 0, 4)
    assert episode.response.usage is None  # nothing counted: no usage on the response
    episode.add_usage(10, 2)
    episode.add_usage(15, 3)
    usage = episode.response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (25, 5, 30)
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="input_tokens must be a non-negative integer"):
            episode.add_usage(bad, 0)
    assert episode.usage == {"input_tokens": 25, "output_tokens": 5}


def test_scripted_rollouts_carry_zero_usage(launched):
    rows = _rows(ScriptedPolicy(SERVER), launched[SERVER])
    assert len(rows) == len(ROWS) and all(row["reward"] == 1.0 for row in rows)
    for row in rows:
        usage = row["response"]["usage"]
        assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (0, 0, 0)


def test_openai_rollouts_sum_the_usage_of_each_reply(launched, openai_base_url):
    """The test endpoint's chat replies count the UTF-8 bytes of the rendered prompt and reply as tokens."""
    policy = OpenAIPolicy("scripted", base_url=openai_base_url, api_key="k", api="chat")
    rows = _rows(policy, launched[SERVER])
    for row in rows:
        turns = sum(1 for item in row["response"]["output"] if item["type"] in ("function_call", "message"))
        usage = row["response"]["usage"]
        assert turns == 2 and usage["output_tokens"] > 0
        # the second call's prompt holds the first's whole prompt and reply: more than both replies
        assert usage["input_tokens"] > usage["output_tokens"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_openai_responses_rollouts_sum_the_usage_of_each_reply(launched, openai_base_url):
    """The test endpoint's Responses replies count one input token per input item, one output token
    per output item: the second turn sees the task's items plus the call and its output."""
    policy = OpenAIPolicy("scripted", base_url=openai_base_url, api_key="k")
    rows = _rows(policy, launched[SERVER])
    assert len(rows) == len(ROWS)
    for row in rows:
        output = row["response"]["output"]
        assert [item["type"] for item in output] == ["function_call", "function_call_output", "message"]
        task = len(row["responses_create_params"]["input"])
        usage = row["response"]["usage"]
        assert (usage["input_tokens"], usage["output_tokens"]) == (task + (task + 2), 1 + 1)
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
