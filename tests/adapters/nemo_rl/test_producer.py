"""The rollout producer (``nemo_gym_env.adapters.nemo_rl.producer``): NeMo RL's streaming contract, without NeMo RL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nemo_gym_env.adapters.nemo_rl import NemoGymRollouts, NemoRLFormatError, RolloutFailed

from ...conftest import example_rows
from ...ray_cluster.players import TokenPolicy
from .layout import as_list, assert_layout, nemo_rl_consume

# ---- the producer: NeMo RL's streaming contract ----------------------------------------------


def _rows(server: str, tasks: int, repeats: int = 1, start: int = 0) -> list[dict[str, Any]]:
    """NeMo RL's batch shape: each task ``repeats`` times in a row (a prompt group), ``_rowidx`` from ``start``."""
    rows = example_rows(server)[:tasks]
    batch = [dict(row, agent_ref={"type": "responses_servers", "name": server}) for row in rows for _ in range(repeats)]
    return [dict(row, _rowidx=start + i) for i, row in enumerate(batch)]


@pytest.fixture(scope="module")
def openai_base_url() -> Any:
    """A fake OpenAI-compatible server returning vLLM-style token data (``tests/fixtures/openai_server.py``)."""
    from tests.fixtures.openai_server import running_server

    with running_server() as url:
        yield url


def _drain(producer: NemoGymRollouts, rows: list[dict]) -> list[tuple[int, dict, dict]]:
    async def run() -> list:
        return [item async for item in producer.run_rollouts(rows, "timing/rollout")]

    return asyncio.run(run())


def test_run_rollouts_streams_every_row_once_concurrently(launched: dict[str, str]) -> None:
    servers = {name: launched[name] for name in ("example_multi_step", "example_single_tool_call")}
    rows = _rows("example_single_tool_call", 3, repeats=2) + _rows("example_multi_step", 3, repeats=2, start=6)

    in_flight = {"now": 0, "most": 0}

    class Routed(TokenPolicy):
        """Plays either server; the first rows are the slowest, so completion order differs from input order."""

        async def generate(self, request):
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
            try:
                await asyncio.sleep(0.4 if request.row["_rowidx"] < 6 else 0.02)
            finally:
                in_flight["now"] -= 1
            server = "example_single_tool_call" if request.row["_rowidx"] < 6 else "example_multi_step"
            return await TokenPolicy(server).generate(request)

    producer = NemoGymRollouts({"initial_global_config_dict": {"concurrency": 64}}, servers=servers,
                               policy=Routed("example_multi_step"))
    out = _drain(producer, rows)
    assert sorted(i for i, _, _ in out) == list(range(12))  # every row exactly once
    assert out[0][0] >= 6  # streamed as they finish: a fast row first, not row 0
    assert in_flight["most"] >= 6, f"rows were not played concurrently: at most {in_flight['most']} turns at once"
    for _, result, timing in out:
        assert_layout(result)
        assert result["full_result"]["reward"] == 1.0
        assert set(timing) == {"timing/rollout/await_results", "timing/rollout/postprocess_results",
                               "timing/rollout/postprocess_results_pct"}
    consumed = nemo_rl_consume([r for _, r, _ in sorted(out, key=lambda x: x[0])], num_generations=2)
    assert sorted(consumed["groups"]) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


def test_the_default_policy_is_an_openai_endpoint_with_token_data(launched: dict[str, str],
                                                                    openai_base_url: str) -> None:
    # What NeMo RL hands the actor: its vLLM servers' base URLs and the model name.
    cfg = {"model_name": "policy-model", "base_urls": [openai_base_url, openai_base_url],
           "initial_global_config_dict": {"server_urls": {"example_single_tool_call":
                                                          launched["example_single_tool_call"]},
                                          "port_range_low": 5000}}
    producer = NemoGymRollouts(cfg)
    producer._spinup()
    producer.health_check()
    assert [p.name for p in producer._policies] == ["openai:chat:policy-model"] * 2
    out = _drain(producer, _rows("example_single_tool_call", 2, repeats=2))
    assert sorted(i for i, _, _ in out) == [0, 1, 2, 3]
    for _, result, _ in out:
        assert_layout(result)
        assert [m["role"] for m in result["message_log"]] == ["user", "assistant", "user", "assistant"]
        assert result["full_result"]["reward"] == 1.0
    import httpx

    last = httpx.get(f"{openai_base_url}/_last/policy-model", timeout=10).json()  # a second-turn request
    assert last["logprobs"] is True and last["top_logprobs"] == 0 and last["return_token_ids"] is True
    seen = last["required_prefix_token_ids"]  # NeMo RL's server pins the history to these tokens
    assert any(seen == as_list(r["message_log"][0]["token_ids"]) + as_list(r["message_log"][1]["token_ids"])
               for _, r, _ in out)


def test_a_row_that_keeps_failing_fails_the_batch_naming_it(launched: dict[str, str]) -> None:
    class Broken(TokenPolicy):
        async def generate(self, request):
            if request.row["_rowidx"] == 2:
                raise RuntimeError("model on fire")
            return await super().generate(request)

    producer = NemoGymRollouts({"initial_global_config_dict": {"max_attempts": 2}},
                               servers={"s": launched["example_single_tool_call"]},
                               policy=Broken("example_single_tool_call"))
    with pytest.raises(RolloutFailed, match=r"row 2 .*failed 2 time\(s\).*model on fire"):
        _drain(producer, _rows("example_single_tool_call", 4))


def test_a_verifier_that_judges_nothing_gives_a_masked_result_never_a_score() -> None:
    """A verify timeout (after every attempt) fills the slot masked, reward 0.0 that no one may read as a
    score; a wrong answer (the model's fault) is an ordinary result with reward 0.0."""
    from nemo_gym_env.launch.launcher import Launcher
    from nemo_gym_env.policies import PolicyTurn

    from ...fixtures import fixture_specs

    class Done:
        async def generate(self, request):
            return PolicyTurn(items=[{"type": "message", "role": "assistant", "id": "m", "status": "completed",
                                      "content": [{"type": "output_text", "text": "done", "annotations": []}]}])

    policy = TokenPolicy("example_single_tool_call")
    policy.scripted = Done()
    task = {"responses_create_params": {"input": [{"role": "user", "content": "Say done."}]}}
    rows = [dict(task, reward=0.0, failure_kind="verify_timeout", failure_reason="math-verify ran out of time"),
            dict(task, reward=0.0, failure_kind="wrong_answer"), dict(task, reward=1.0)]
    rows = [dict(row, _rowidx=i) for i, row in enumerate(rows)]
    with Launcher() as launcher:
        url = launcher.start(fixture_specs("rewards")["rewards"]).url
        producer = NemoGymRollouts({"initial_global_config_dict": {"max_attempts": 2}}, servers={"r": url},
                                   policy=policy)
        out = {i: result for i, result, _ in _drain(producer, rows)}
    assert sorted(out) == [0, 1, 2]
    for result in out.values():
        assert_layout(result)
    masked = out[0]["full_result"]
    assert masked["reward"] == 0.0 and masked["instance_config"]["mask_sample"] is True
    assert masked["failure_kind"] == "verify_timeout" and "math-verify ran out of time" in masked["failure_reason"]
    assert out[1]["full_result"]["reward"] == 0.0 and "instance_config" not in out[1]["full_result"]
    assert out[2]["full_result"]["reward"] == 1.0 and "instance_config" not in out[2]["full_result"]
    consumed = nemo_rl_consume([out[i] for i in range(3)], num_generations=1)
    assert len(consumed["flat"]) == 3  # NeMo RL's side takes all three; the mask is its to apply


def test_a_re_tokenizing_policy_fails_naming_the_row_and_turn(launched: dict[str, str]) -> None:
    class Retokenizes(TokenPolicy):
        async def generate(self, request):
            turn = await super().generate(request)
            if request.history:
                turn.prompt_token_ids = [7] + turn.prompt_token_ids[1:]
            return turn

    producer = NemoGymRollouts(servers={"s": launched["example_single_tool_call"]},
                               policy=Retokenizes("example_single_tool_call"))
    with pytest.raises(NemoRLFormatError, match=r"row 0 \(task 0\): turn 2 .*not a continuation.*position 0"):
        _drain(producer, _rows("example_single_tool_call", 1))


def test_rows_must_name_a_server_when_there_are_several(launched: dict[str, str]) -> None:
    producer = NemoGymRollouts(servers={"a": launched["example_single_tool_call"],
                                        "b": launched["example_multi_step"]},
                               policy=TokenPolicy("example_single_tool_call"))
    rows = _rows("example_single_tool_call", 1)
    with pytest.raises(ValueError, match=r"row 0: agent_ref.name is 'example_single_tool_call'.*\(a, b\)"):
        _drain(producer, rows)
    with pytest.raises(ValueError, match="must not be empty"):
        _drain(producer, [])


def test_bundled_servers_are_launched_and_shut_down() -> None:
    producer = NemoGymRollouts({"initial_global_config_dict": {"servers": ["example_single_tool_call"],
                                                               "tensors": False}},
                               policy={"kind": "scripted", "server": "example_single_tool_call"})
    try:
        producer._spinup()
        url = producer.servers["example_single_tool_call"]
        producer.health_check()
        with pytest.raises(NemoRLFormatError, match="no turn with token data"):  # a policy without tokens
            _drain(producer, _rows("example_single_tool_call", 1))
    finally:
        producer.shutdown()
        producer.shutdown()
    import httpx

    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/", timeout=2.0)


def test_step_rewards_reach_each_turn_of_the_message_log(launched: dict[str, str]) -> None:
    """example_multi_step gives 0.1 per new lookup: each assistant message carries its turn's step reward."""
    producer = NemoGymRollouts({}, servers={"example_multi_step": launched["example_multi_step"]},
                               policy=TokenPolicy("example_multi_step"))
    out = _drain(producer, _rows("example_multi_step", 2))
    assert sorted(i for i, _, _ in out) == [0, 1]
    for _, result, _ in out:
        assert_layout(result)
        full = result["full_result"]
        turns = [m["step_reward"] for m in result["message_log"] if m["role"] == "assistant"]
        assert turns == full["step_rewards"] and sum(turns) == pytest.approx(full["step_reward_sum"])
        assert full["step_reward_sum"] > 0 and full["reward"] == 1.0  # the episode's reward stays /verify's
