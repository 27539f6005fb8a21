"""OpenAIPolicy against a real OpenAI-compatible server process on loopback (tests/fixtures/openai_server.py)."""

from __future__ import annotations

import logging
import socket
import time
import traceback
import uuid
from collections.abc import Iterator

import gymnasium as gym
import httpx
import pytest
from omegaconf import OmegaConf

import nemo_gym_env  # noqa: F401  (registers the env ids)
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.errors import PolicyTimeout
from nemo_gym_env.policies import OpenAIPolicy, PolicyError, PolicyRequest
from nemo_gym_env.policies.openai_compat import chat_token_data

from .conftest import play

KEY = "sk-test-Do-Not-Leak-7f3a9c2e1b"
REQUEST = PolicyRequest(input=[{"role": "user", "content": "Weather in Oslo?"}], history=[])


@pytest.fixture(scope="module")
def env() -> Iterator[gym.Env]:
    env = gym.make("NemoGym/example_single_tool_call-v0")
    yield env
    env.close()


def tag(knob: str) -> str:
    """A model name carrying ``knob`` and a unique tail, so server-side counters start at zero."""
    return f"{knob}-{uuid.uuid4().hex[:8]}"


def requests_seen(base_url: str, model: str) -> int:
    return httpx.get(f"{base_url}/_stats").json().get(model, 0)


def generate(policy: OpenAIPolicy, request: PolicyRequest = REQUEST):
    return background_loop().run(policy.generate(request))


# ---- episodes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_episode_reaches_reward_one(env, openai_base_url, api):
    policy = OpenAIPolicy("scripted", base_url=openai_base_url, api_key=KEY, api=api)
    reward, turns, info = play(env, policy, seed=3)
    assert reward == 1.0 and info["turn"] == 2
    assert turns[0].items[0]["type"] == "function_call"
    assert turns[1].items[0]["type"] == "message"
    assert env.unwrapped.last_verify["num_tool_calls"] == 1


@pytest.mark.parametrize("knob", ["hermes", "think"])
def test_chat_variants_reach_reward_one(env, openai_base_url, knob):
    """Tool calls left as Hermes markup in content, and reasoning_content, still make a valid episode."""
    policy = OpenAIPolicy(tag(knob), base_url=openai_base_url, api="chat")
    reward, turns, _ = play(env, policy, seed=1)
    assert reward == 1.0
    if knob == "think":
        assert [i["type"] for i in turns[0].items] == ["reasoning", "function_call"]


def test_responses_reasoning_items_round_trip(env, openai_base_url):
    policy = OpenAIPolicy(tag("think"), base_url=openai_base_url, api="responses")
    reward, turns, _ = play(env, policy, seed=2)
    assert reward == 1.0
    assert [i["type"] for i in turns[1].items] == ["reasoning", "message"]


def test_chat_token_data_over_an_episode(env, openai_base_url):
    policy = OpenAIPolicy("scripted", base_url=openai_base_url, api="chat", token_data=True)
    reward, turns, _ = play(env, policy, seed=0)
    assert reward == 1.0
    seen: list[int] = []
    for turn in turns:
        assert turn.prompt_token_ids[: len(seen)] == seen  # the token invariant, docs/architecture.md "The wire"
        assert len(turn.generation_log_probs) == len(turn.generation_token_ids) > 0
        seen = turn.prompt_token_ids + turn.generation_token_ids
    last = env.unwrapped.response.output[0]
    assert last.generation_token_ids == turns[0].generation_token_ids  # carried into the trajectory


def test_chat_token_data_shapes():
    vllm = {"prompt_token_ids": [1, 2], "choices": [{"token_ids": [3, 4], "message": {},
                                                     "logprobs": {"content": [{"token": "a", "logprob": -1.0},
                                                                              {"token": "b", "logprob": -2.0}]}}]}
    assert chat_token_data(vllm) == ([1, 2], [3, 4], [-1.0, -2.0])
    as_ids = {"choices": [{"message": {}, "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5}]}}]}
    assert chat_token_data(as_ids) == (None, [7], [-0.5])
    nemo = {"choices": [{"message": {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}}]}
    assert chat_token_data(nemo) == ([1], [2], [-0.1])
    assert chat_token_data({"choices": [{"message": {"content": "x"}}]}) == (None, None, None)


def test_sampling_tools_and_token_requests_reach_the_wire(openai_base_url):
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    request = PolicyRequest(
        input=[{"role": "user", "content": "Weather in Oslo?"}], history=[], tools=[tool],
        sampling={"temperature": 0.9, "top_p": 0.5, "max_output_tokens": 20, "instructions": "Be brief.",
                  "tool_choice": {"type": "function", "name": "get_weather"}},
    )
    for api in ("chat", "responses"):
        model = tag("scripted")
        policy = OpenAIPolicy(model, base_url=openai_base_url, api=api, sampling={"temperature": 0.3}, token_data=True)
        generate(policy, request)
        body = httpx.get(f"{openai_base_url}/_last/{model}").json()
        assert (body["temperature"], body["top_p"]) == (0.3, 0.5)  # the policy's override wins
        if api == "chat":
            assert body["max_completion_tokens"] == 20
            assert body["messages"][0] == {"role": "system", "content": "Be brief."}
            assert body["tools"][0]["function"]["name"] == "get_weather"
            assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
            assert body["logprobs"] is True and body["return_token_ids"] is True
        else:
            assert (body["max_output_tokens"], body["instructions"]) == (20, "Be brief.")
            assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
            assert "return_token_ids" not in body


# ---- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_retries_429_then_succeeds(openai_base_url, api):
    model = tag("fail429-2")
    turn = generate(OpenAIPolicy(model, base_url=openai_base_url, api=api, max_retries=3))
    assert turn.items[0]["type"] == "message"
    assert requests_seen(openai_base_url, model) == 3


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_500_forever_fails_after_bounded_retries(openai_base_url, api):
    model = tag("fail500")
    with pytest.raises(PolicyError, match=r"HTTP 500 after 2 retries.*the model crashed") as caught:
        generate(OpenAIPolicy(model, base_url=openai_base_url, api=api, max_retries=2))
    assert caught.value.status_code == 500
    assert requests_seen(openai_base_url, model) == 3
    assert openai_base_url in str(caught.value) and model in str(caught.value)


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("knob,match", [("garbage", "malformed reply"), ("badshape", "not a (chat completion|Response)")])
def test_garbage_reply_is_a_clear_error(openai_base_url, api, knob, match):
    with pytest.raises(PolicyError, match=match):
        generate(OpenAIPolicy(tag(knob), base_url=openai_base_url, api=api, max_retries=0))


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_hang_times_out(openai_base_url, api):
    policy = OpenAIPolicy(tag("hang"), base_url=openai_base_url, api=api, timeout_s=0.5, max_retries=1)
    started = time.monotonic()
    with pytest.raises(PolicyTimeout, match=r"no reply in time, after 1 retry: each attempt 0.5 s \(timeout_s"):
        generate(policy)
    assert time.monotonic() - started < 10


def test_unreachable_server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    policy = OpenAIPolicy("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(PolicyError, match="cannot connect") as caught:
        generate(policy)
    assert KEY not in str(caught.value)


# ---- the key -----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_key_never_in_errors_logs_or_repr(openai_base_url, api, caplog):
    for name in (None, "nemo_gym_env"):  # debug lines on
        caplog.set_level(logging.DEBUG, logger=name)
    policy = OpenAIPolicy(tag("echo-key"), base_url=openai_base_url, api_key=KEY, api=api, max_retries=0)
    with pytest.raises(PolicyError, match=r"HTTP 401.*check policy_api_key") as caught:
        generate(policy)
    error = caught.value
    assert "Incorrect API key provided: ***" in str(error)  # the server echoed it; we redacted it
    printed = "".join(traceback.format_exception(error))
    for text in (str(error), repr(error), printed, repr(policy), str(vars(policy)), caplog.text):
        assert KEY not in text
    assert "api_key='***'" in repr(policy)
    assert "POST /" in caplog.text and "HTTP 401" in caplog.text  # the policy's debug lines were captured


def test_openai_key_from_environment_is_not_sent_elsewhere(openai_base_url, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    policy = OpenAIPolicy(tag("echo-key"), base_url=openai_base_url, max_retries=0)
    with pytest.raises(PolicyError, match="Incorrect API key provided: EMPTY"):
        generate(policy)


def test_from_config_reads_env_yaml_keys(openai_base_url, env):
    config = OmegaConf.create({"policy_base_url": openai_base_url, "policy_api_key": KEY, "policy_model_name": "scripted"})
    policy = OpenAIPolicy.from_config(config, api="chat")
    assert (policy.model, policy.base_url, policy.api) == ("scripted", openai_base_url, "chat")
    assert play(env, policy, seed=4)[0] == 1.0
    with pytest.raises(ValueError, match="policy_model_name"):
        OpenAIPolicy.from_config({})
    unset_key = OmegaConf.create({"policy_base_url": openai_base_url, "policy_api_key": "???", "policy_model_name": "m"})
    assert "api_key=None" in repr(OpenAIPolicy.from_config(unset_key))


def test_repr_hides_url_credentials():
    policy = OpenAIPolicy("m", base_url="http://user:pw@127.0.0.1:9/v1")
    assert "pw" not in repr(policy) and "***@127.0.0.1:9" in repr(policy)


def test_works_from_several_event_loops(openai_base_url):
    """A client per loop: asyncio.run twice, then the background loop."""
    import asyncio

    policy = OpenAIPolicy("scripted", base_url=openai_base_url, api="chat")
    for _ in range(2):
        assert asyncio.run(policy.generate(REQUEST)).items
    assert generate(policy).items
    background_loop().run(policy.aclose())
