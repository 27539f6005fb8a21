"""One rollout and many (``rollouts.jobs``): sampling overrides, and ``collect`` against a launched server."""

from __future__ import annotations

import asyncio

from nemo_gym_env.launch.catalog import bundled_dataset
from nemo_gym_env.policies import Policy, PolicyRequest, PolicyTurn, ScriptedPolicy
from nemo_gym_env.protocol.dataset import load_rows
from nemo_gym_env.rollouts.identity import task_keys
from nemo_gym_env.rollouts.jobs import apply_sampling, collect
from nemo_gym_env.rollouts.output import is_failure


def test_apply_sampling_does_not_touch_the_original():
    row = {"responses_create_params": {"input": "hi", "temperature": 1.0}, "x": 1}
    assert apply_sampling(row, {"temperature": 0.1, "top_p": None})["responses_create_params"]["temperature"] == 0.1
    assert row["responses_create_params"]["temperature"] == 1.0
    assert apply_sampling(row, {}) is row


class _Exploding(Policy):
    name = "exploding"

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        raise ConnectionRefusedError("policy endpoint refused")


def test_collect_against_a_launched_server(launched):
    server = "example_single_tool_call"
    rows = load_rows(bundled_dataset(server))

    async def run(policy, **kwargs):
        return [row async for row in collect(rows, policy, launched[server], server_name=server, **kwargs)]

    keys = task_keys(rows)
    results = asyncio.run(run(ScriptedPolicy(server), num_repeats=3, concurrency=4,
                              skip={(server, keys[0], 0), (server, keys[4], 2)}, sampling={"temperature": 0.5}))
    keys = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in results}
    assert keys == {(t, r) for t in range(5) for r in range(3)} - {(0, 0), (4, 2)}
    assert len(results) == 13 and all(r["reward"] == 1.0 and not is_failure(r) for r in results)
    assert results[0]["responses_create_params"]["temperature"] == 0.5
    assert results[0]["agent_ref"] == {"type": "resources_servers", "name": server}

    failed = asyncio.run(run(_Exploding(), concurrency=2))
    assert len(failed) == 5 and all(is_failure(r) for r in failed)
    assert failed[0]["_ng_failure_class"] == "policy_error" and "refused" in failed[0]["failure_reason"]
