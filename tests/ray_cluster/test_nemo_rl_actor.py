"""Our NeMo RL actor on the loopback cluster, driven the way NeMo RL's GRPO drives NeMo Gym's.

``run_async_nemo_gym_rollout`` calls ``run_rollouts.options(num_returns="streaming").remote(rows,
timer_prefix, ...)``, iterates the stream asynchronously, awaits each ``(rowidx, result, timing)``,
tensorizes the token fields and accumulates rows by index, refusing duplicates and gaps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from nemo_gym_env.adapters.nemo_rl import actor_class, spinup_actor

from ..adapters.nemo_rl.layout import assert_layout, nemo_rl_consume
from ..conftest import example_rows
from .players import TokenPolicyFactory

pytestmark = pytest.mark.slow

SERVER = "example_single_tool_call"


def batch(tasks: int, generations: int) -> list[dict[str, Any]]:
    rows = example_rows(SERVER)[:tasks]
    out = [dict(row, agent_ref={"type": "responses_api_agents", "name": SERVER}) for row in rows
           for _ in range(generations)]
    return [dict(row, _rowidx=i) for i, row in enumerate(out)]


def drive(actor: Any, rows: list[dict[str, Any]]) -> list[tuple[int, dict, dict]]:
    """NeMo RL's consumer loop, reduced to its checks."""
    import torch

    async def consume() -> list[tuple[int, dict, dict]]:
        stream = actor.run_rollouts.options(num_returns="streaming").remote(rows, "timing/rollout", False)
        received: dict[int, tuple[int, dict, dict]] = {}
        async for ref in stream:
            row_index, result, timing = await ref
            assert isinstance(row_index, int) and 0 <= row_index < len(rows)
            assert row_index not in received, f"duplicate row index {row_index}"
            for message in result["message_log"]:  # _tensorize_nemo_gym_result
                message["token_ids"] = torch.as_tensor(message["token_ids"])
            received[row_index] = (row_index, result, timing)
        assert sorted(received) == list(range(len(rows))), "the stream ended before every row arrived"
        return [received[i] for i in range(len(rows))]

    return asyncio.run(consume())


@pytest.fixture(scope="module")
def openai_base_url(ray_cluster) -> Iterator[str]:
    from tests.fixtures.openai_server import running_server

    with running_server() as url:
        yield url


def test_the_actor_streams_a_grpo_batch(ray_cluster, launched: dict[str, str]) -> None:
    import ray
    import torch

    actor = actor_class().options(num_cpus=0).remote(servers={SERVER: launched[SERVER]},
                                                     policy=TokenPolicyFactory(SERVER, delay_s=0.05))
    try:
        ray.get(actor._spinup.remote(), timeout=120)
        ray.get(actor.set_tokenizer.remote(None))
        out = drive(actor, batch(tasks=3, generations=2))
        for _, result, timing in out:
            assert_layout(result)
            assert result["message_log"][1]["generation_logprobs"].dtype == torch.float32  # tensors, as NeMo Gym's
        assert out[-1][2]["timing/rollout/postprocess_results"] > 0
        consumed = nemo_rl_consume([r for _, r, _ in out], num_generations=2)
        assert consumed["groups"] == [[0, 1], [2, 3], [4, 5]]
        ray.get(actor.health_check.remote(), timeout=60)
    finally:
        ray.kill(actor, no_restart=True)


def test_spinup_as_nemo_rl_calls_it(ray_cluster, openai_base_url: str) -> None:
    """What NeMo RL's setup hands over: env config, its vLLM servers' URLs, the model name, a tokenizer."""
    import ray

    env_configs = {"should_use_nemo_gym": True,
                   "nemo_gym": {"servers": [SERVER], "placement": "ray", "server_host": "127.0.0.1",
                                "port_range_low": 5000, "port_range_high": 5999, "thinking_tags": ["<think>", "</think>"]}}
    actor = spinup_actor(env_configs, [openai_base_url], "policy-model", tokenizer="a tokenizer",
                         enable_router_replay=False, routed_experts_dtype="int16", use_fastokens=False)
    try:
        out = drive(actor, batch(tasks=2, generations=2))
        for _, result, _ in out:
            assert_layout(result)
            assert result["full_result"]["reward"] == 1.0
            assert [m["role"] for m in result["message_log"]] == ["user", "assistant"] * 2
        ray.get(actor.health_check.remote(), timeout=60)
    finally:
        ray.get(actor.shutdown.remote(), timeout=60)
        ray.kill(actor, no_restart=True)
