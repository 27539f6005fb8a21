"""The NeMo RL adapter without NeMo RL: the result layout, its invariants, the rollout producer, registration.

The layout is checked explicitly (no jsonschema) against what NeMo RL's
``_postprocess_nemo_gym_to_nemo_rl_result`` builds and its GRPO consumes; the consumer
simulation (``nemo_rl_consume``) reproduces what NeMo RL does with a batch of results.
"""

from __future__ import annotations

import asyncio
import copy
import math
import sys
import time
import types
from collections import defaultdict
from typing import Any

import pytest

from nemo_gym_env.adapters.nemo_rl import (
    NemoGymRollouts,
    NemoRLFormatError,
    RolloutFailed,
    check_nemo_rl_result,
    register_with_nemo_rl,
    to_nemo_rl_result,
    token_turns,
)
from nemo_gym_env.policies import PolicyTurn

from ..conftest import example_rows
from ..ray.players import TokenPolicy

# ---- the layout, explicitly ------------------------------------------------------------------


def assert_layout(result: dict[str, Any]) -> None:
    """Every rule of the result layout, checked one by one (lists or tensors)."""
    assert set(result) >= {"message_log", "input_message_log", "full_result"}
    log = result["message_log"]
    assert isinstance(log, list) and log and len(log) % 2 == 0
    for i, message in enumerate(log):
        assert message["role"] == ("user" if i % 2 == 0 else "assistant"), f"message {i} breaks the alternation"
        assert message["content"] == ""
        tokens = _list(message["token_ids"])
        assert tokens and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens)
        if message["role"] == "assistant":
            log_probs = _list(message["generation_logprobs"])
            assert len(log_probs) == len(tokens)
            assert all(isinstance(lp, float) and math.isfinite(lp) for lp in log_probs)
            assert isinstance(message["is_invalid_tool_call"], bool)
            assert isinstance(message["has_malformed_thinking"], bool)
        else:
            assert "generation_logprobs" not in message
    assert len(result["input_message_log"]) == 1
    assert _list(result["input_message_log"][0]["token_ids"]) == _list(log[0]["token_ids"])
    assert isinstance(result["full_result"]["reward"], float)
    check_nemo_rl_result(result)  # the adapter's own check agrees


def _list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


# ---- what NeMo RL does with the results ------------------------------------------------------


def nemo_rl_consume(results: list[dict[str, Any]], num_generations: int) -> dict[str, Any]:
    """NeMo RL's side, reproduced: tensorize per message, flatten, loss mask, group by prompt."""
    torch = pytest.importorskip("torch")
    flat, masks, logprobs, groups = [], [], [], defaultdict(list)
    for index, result in enumerate(results):
        tokens, mask, lps = [], [], []
        for message in result["message_log"]:
            ids = torch.as_tensor(message["token_ids"])  # _tensorize_nemo_gym_result
            assert ids.dtype == torch.int64 and ids.dim() == 1
            tokens.append(ids)
            is_model = message["role"] == "assistant"
            mask.append(torch.full_like(ids, int(is_model)))  # loss mask: 1 on assistant tokens
            lp = torch.as_tensor(message["generation_logprobs"]) if is_model else torch.zeros(len(ids))
            assert len(lp) == len(ids)
            lps.append(lp.float())
        flat.append(torch.cat(tokens))
        masks.append(torch.cat(mask))
        logprobs.append(torch.cat(lps))
        first = tuple(torch.as_tensor(result["input_message_log"][0]["token_ids"]).tolist())
        groups[first].append(index)
    for members in groups.values():
        assert len(members) % num_generations == 0, "a prompt group lost or gained a rollout"
    return {"flat": flat, "masks": masks, "logprobs": logprobs, "groups": list(groups.values())}


def generated_tokens(turns: list[PolicyTurn] | list[dict]) -> list[int]:
    out = []
    for turn in turns:
        out += list(turn["generation_token_ids"] if isinstance(turn, dict) else turn.generation_token_ids)
    return out


def assert_masks_cover_generations(consumed: dict[str, Any], index: int, turns: list) -> None:
    """Mask 1 exactly on the generated tokens; the flattened sequence is the last call's prompt + generation."""
    flat, mask = consumed["flat"][index].tolist(), consumed["masks"][index].tolist()
    assert [t for t, m in zip(flat, mask) if m] == generated_tokens(turns)
    last = turns[-1]
    prompt = list(last["prompt_token_ids"] if isinstance(last, dict) else last.prompt_token_ids)
    generation = list(last["generation_token_ids"] if isinstance(last, dict) else last.generation_token_ids)
    assert flat == prompt + generation
    assert sum(mask) == len(generated_tokens(turns))


# ---- turns of a made-up three-call episode ---------------------------------------------------


def three_turns() -> list[dict[str, Any]]:
    return [
        {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [10, 11], "generation_log_probs": [-0.5, -0.25]},
        {"prompt_token_ids": [1, 2, 3, 10, 11, 4, 5], "generation_token_ids": [12], "generation_log_probs": [-1.0]},
        {"prompt_token_ids": [1, 2, 3, 10, 11, 4, 5, 12, 6], "generation_token_ids": [13, 14, 15],
         "generation_log_probs": [-0.1, -0.2, -0.3]},
    ]


VERIFY = {"responses_create_params": {"input": "hi"}, "reward": 1.0}


def test_three_turns_become_alternating_messages_of_new_tokens() -> None:
    result = to_nemo_rl_result(three_turns(), VERIFY)
    assert_layout(result)
    assert [(m["role"], m["token_ids"]) for m in result["message_log"]] == [
        ("user", [1, 2, 3]), ("assistant", [10, 11]), ("user", [4, 5]), ("assistant", [12]),
        ("user", [6]), ("assistant", [13, 14, 15])]
    assert result["message_log"][1]["generation_logprobs"] == [-0.5, -0.25]
    assert result["input_message_log"] == result["message_log"][:1]
    assert result["full_result"] == VERIFY


def test_policy_turns_and_tensors() -> None:
    torch = pytest.importorskip("torch")
    turns = [PolicyTurn(items=[{"type": "message", "role": "assistant", "content": "<think>x</think>ok"}], **t)
             for t in three_turns()]
    result = to_nemo_rl_result(turns, VERIFY, tensors=True)
    assert_layout(result)
    assert result["message_log"][0]["token_ids"].dtype == torch.int64
    assert result["message_log"][1]["generation_logprobs"].dtype == torch.float32
    assert result["message_log"][1]["has_malformed_thinking"] is True  # think tags left in a final message


def test_a_verify_reply_is_the_source_and_is_not_changed() -> None:
    items = [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", **three_turns()[0]},
             {"type": "function_call_output", "call_id": "c1", "output": "{}"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "<tool_call>"}],
              **three_turns()[1]}]
    reply = {**VERIFY, "response": {"output": items}, "reward_components": {"a": 0.25, "b": 0.75}}
    before = copy.deepcopy(reply)
    result = to_nemo_rl_result(reply)
    assert reply == before
    assert_layout(result)
    assert [m["role"] for m in result["message_log"]] == ["user", "assistant"] * 2
    assert result["message_log"][3]["is_invalid_tool_call"] is True  # tool-call markup the env did not run
    assert all(not set(i) & {"prompt_token_ids", "generation_token_ids"}
               for i in result["full_result"]["response"]["output"])
    assert result["full_result"]["reward_components"] == {"a": 0.25, "b": 0.75}


def test_an_empty_generation_is_skipped_as_nemo_rl_skips_it() -> None:
    turns = three_turns()
    turns[1] = {**turns[1], "generation_token_ids": [], "generation_log_probs": []}
    turns[2] = {**turns[2], "prompt_token_ids": [1, 2, 3, 10, 11, 4, 5, 6]}
    result = to_nemo_rl_result(turns, VERIFY)
    assert [m["token_ids"] for m in result["message_log"]] == [[1, 2, 3], [10, 11], [4, 5, 6], [13, 14, 15]]


# ---- each invariant, violated on purpose -----------------------------------------------------


def _broken(turn: int, **change: Any) -> list[dict[str, Any]]:
    turns = three_turns()
    turns[turn] = {**turns[turn], **change}
    return turns


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        (_broken(1, prompt_token_ids=[1, 2, 9, 10, 11, 4]), r"turn 2 .*not a continuation.*position 2, expected 3, got 9"),
        (_broken(2, prompt_token_ids=[1, 2, 3, 10]), r"turn 3 .*not a continuation.*expected 11, got the end"),
        (_broken(1, prompt_token_ids=[1, 2, 3, 10, 11]), r"turn 2 .*adds no token"),
        (_broken(0, prompt_token_ids=[]), r"turn 1 .*adds no token"),
        (_broken(0, generation_log_probs=[-0.5]), r"turn 1 .*1 generation_log_probs for 2 generation_token_ids"),
        (_broken(2, generation_log_probs=[-0.1, float("nan"), -0.3]), r"turn 3 .*\[1\] = nan is not a finite"),
        (_broken(2, generation_log_probs=[-0.1, float("-inf"), -0.3]), r"turn 3 .*-inf is not a finite"),
        (_broken(0, generation_log_probs=None), r"turn 1 .*must return log-probabilities"),
        (_broken(1, generation_token_ids=[1.5]), r"turn 2 .*generation_token_ids\[0\] = 1.5 is not a token id"),
        (_broken(1, generation_token_ids=[True]), r"turn 2 .*is not a token id"),
        (_broken(0, prompt_token_ids=[1, -2, 3]), r"turn 1 .*prompt_token_ids\[1\] = -2"),
        (_broken(2, prompt_token_ids=None), r"turn 3 .*no prompt_token_ids"),
        ([{"type": "function_call_output", "call_id": "c", "output": "x"}], r"no turn with token data"),
    ],
)
def test_each_broken_invariant_names_the_turn(turns: list, message: str) -> None:
    with pytest.raises(NemoRLFormatError, match=message):
        to_nemo_rl_result(turns, VERIFY)


@pytest.mark.parametrize(
    ("verify", "message"),
    [
        ({"reward": 1.0, "reward_components": {"a": 0.5, "b": 0.25}}, r"reward_components sum to 0.75"),
        ({"reward": float("nan")}, r"finite number"),
        ({"reward": True}, r"finite number"),
        ({"response": {}}, r"finite number"),
        ({"reward": 1.0, "reward_components": {"a": "x"}}, r"reward_components\['a'\]"),
    ],
)
def test_reward_checks(verify: dict, message: str) -> None:
    with pytest.raises(NemoRLFormatError, match=message):
        to_nemo_rl_result(three_turns(), verify)


def test_check_nemo_rl_result_rejects_broken_layouts() -> None:
    good = to_nemo_rl_result(three_turns(), VERIFY)
    cases = {
        "roles alternate": lambda r: r["message_log"].reverse(),
        "content must be ''": lambda r: r["message_log"][0].update(content="hi"),
        "token_ids is empty": lambda r: r["message_log"][2].update(token_ids=[]),
        "same length": lambda r: r["message_log"][1].update(generation_logprobs=[-1.0]),
        "message_log\\[:1\\]": lambda r: r.update(input_message_log=r["message_log"][2:3]),
        "no full_result": lambda r: r.pop("full_result"),
    }
    for message, breaks in cases.items():
        broken = copy.deepcopy(good)
        breaks(broken)
        with pytest.raises(NemoRLFormatError, match=message):
            check_nemo_rl_result(broken)


def test_token_turns_of_items_skip_environment_items() -> None:
    items = [{"type": "function_call_output", "call_id": "c", "output": "x"},
             {"type": "message", "role": "assistant", "content": "a", **three_turns()[0]}]
    turns = token_turns(items)
    assert len(turns) == 1 and turns[0].where == "output item 1"


# ---- the producer: NeMo RL's streaming contract ----------------------------------------------


def _rows(server: str, tasks: int, repeats: int = 1, start: int = 0) -> list[dict[str, Any]]:
    """NeMo RL's batch shape: each task ``repeats`` times in a row (a prompt group), ``_rowidx`` from ``start``."""
    rows = example_rows(server)[:tasks]
    batch = [dict(row, agent_ref={"type": "responses_servers", "name": server}) for row in rows for _ in range(repeats)]
    return [dict(row, _rowidx=start + i) for i, row in enumerate(batch)]


@pytest.fixture(scope="module")
def openai_base_url() -> Any:
    """A fake OpenAI-compatible server returning vLLM-style token data (``tests/openai_server.py``)."""
    from tests.openai_server import running_server

    with running_server() as url:
        yield url


def _drain(producer: NemoGymRollouts, rows: list[dict]) -> list[tuple[int, dict, dict]]:
    async def run() -> list:
        return [item async for item in producer.run_rollouts(rows, "timing/rollout")]

    return asyncio.run(run())


def test_run_rollouts_streams_every_row_once_concurrently(launched: dict[str, str]) -> None:
    servers = {name: launched[name] for name in ("example_multi_step", "example_single_tool_call")}
    rows = _rows("example_single_tool_call", 3, repeats=2) + _rows("example_multi_step", 3, repeats=2, start=6)

    class Routed(TokenPolicy):
        """Plays either server; the first rows are the slowest, so completion order differs from input order."""

        async def generate(self, request):
            await asyncio.sleep(0.4 if request.row["_rowidx"] < 6 else 0.02)
            server = "example_single_tool_call" if request.row["_rowidx"] < 6 else "example_multi_step"
            return await TokenPolicy(server).generate(request)

    producer = NemoGymRollouts({"initial_global_config_dict": {"concurrency": 64}}, servers=servers,
                               policy=Routed("example_multi_step"))
    started = time.monotonic()
    out = _drain(producer, rows)
    elapsed = time.monotonic() - started
    assert sorted(i for i, _, _ in out) == list(range(12))  # every row exactly once
    assert out[0][0] >= 6  # streamed as they finish: a fast row first, not row 0
    assert elapsed < 6 * 2 * 0.4, "rows were not played concurrently"
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
    assert any(seen == _list(r["message_log"][0]["token_ids"]) + _list(r["message_log"][1]["token_ids"])
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


# ---- registration ----------------------------------------------------------------------------


def test_register_without_nemo_rl_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nemo_rl", None)
    with pytest.raises(ImportError, match=r"empty placeholder.*install NeMo RL from source.*NemoGymRollouts"):
        register_with_nemo_rl()


def test_register_replaces_nemo_gyms_actor_in_nemo_rl(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")

    def original(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("NeMo Gym's actor must not be created")

    fake: dict[str, types.ModuleType] = {}
    for name in ("nemo_rl", "nemo_rl.environments", "nemo_rl.environments.nemo_gym", "nemo_rl.algorithms",
                 "nemo_rl.algorithms.grpo", "nemo_rl.algorithms.distillation", "nemo_rl.distributed",
                 "nemo_rl.distributed.ray_actor_environment_registry"):
        fake[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, fake[name])
    for name in ("nemo_rl.environments.nemo_gym", "nemo_rl.algorithms.grpo"):
        fake[name].spinup_nemo_gym_actor = original
    fake["nemo_rl.environments.nemo_gym"].NemoGym = object
    fake["nemo_rl.algorithms.distillation"].NemoGym = object
    fake["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY = {
        "nemo_rl.environments.nemo_gym.NemoGym": "uv run --extra nemo_gym"}
    register_with_nemo_rl()
    spinup = register_with_nemo_rl()  # idempotent: a second call just installs again
    from nemo_gym_env.adapters.nemo_rl import actor_class

    assert fake["nemo_rl.environments.nemo_gym"].spinup_nemo_gym_actor is spinup

    assert fake["nemo_rl.algorithms.grpo"].spinup_nemo_gym_actor._nemo_gym_env
    assert fake["nemo_rl.environments.nemo_gym"].spinup_nemo_gym_actor._nemo_gym_env
    assert fake["nemo_rl.algorithms.distillation"].NemoGym is actor_class()
    registry = fake["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY
    assert registry["nemo_rl.environments.nemo_gym.NemoGym"] == sys.executable
