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


def test_expand_gives_tasks_times_repeats_in_order_less_the_done_ones_with_sampling_applied():
    from nemo_gym_env.rollouts.jobs import Task, expand, skipping

    rows = [{"responses_create_params": {"input": f"q{i}", "temperature": 1.0}} for i in range(3)]
    tasks = [Task(10 + i, f"k{i}", row, "srv") for i, row in enumerate(rows)]
    planned = list(expand(tasks, 2, sampling={"temperature": 0.0, "top_p": None},
                          is_done=skipping([("srv", "k1", 0), ("other", "k2", 1)])))
    assert [(p.task.index, p.rollout_index) for p in planned] == [(10, 0), (10, 1), (11, 1), (12, 0), (12, 1)]
    assert all(p.row["responses_create_params"]["temperature"] == 0.0 for p in planned)
    assert rows[0]["responses_create_params"]["temperature"] == 1.0  # the task's own row is untouched
    # is_done gets (server, task key, task index, rollout index): a resumed file's older rows match by index.
    seen = []
    list(expand(tasks[:1], 1, is_done=lambda *identity: seen.append(identity) or False))
    assert seen == [("srv", "k0", 10, 0)]


def test_the_settings_hand_every_rollout_option_to_the_workers():
    """Every field of RolloutOptions comes from RolloutSettings: a new option cannot be dropped on the way."""
    import dataclasses

    from nemo_gym_env.rollouts.settings import RolloutOptions, RolloutSettings

    settings = RolloutSettings(max_steps=7, turn_timeout=12.5, episode_reward="sum", max_episode_tokens=99)
    options = settings.options
    assert options == RolloutOptions(max_steps=7, turn_timeout_s=12.5, episode_reward="sum", max_episode_tokens=99)
    defaults = RolloutOptions()
    assert all(getattr(options, f.name) != getattr(defaults, f.name) for f in dataclasses.fields(RolloutOptions))
