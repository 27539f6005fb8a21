"""LocalPolicy with the real embedded model (SmolLM2-135M-Instruct on CPU): few, short generations."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator

import gymnasium as gym
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import nemo_gym_env  # noqa: F401  (registers the env ids)
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.policies import PolicyRequest, make_policy
from nemo_gym_env.policies.local import LocalPolicy
from nemo_gym_env.policies.render import ChatRenderer as _Renderer

from ..conftest import example_rows
from .conftest import play

pytestmark = pytest.mark.slow

TOOLS = example_rows("example_single_tool_call")[0]["responses_create_params"]["tools"]


def _call(city: str) -> str:
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


def _response(city: str) -> str:
    reply = json.dumps({"city": city, "weather_description": f"The weather in {city} is cold."}, separators=(",", ":"))
    return f"<tool_response>\n{reply}\n</tool_response>"


def _few_shot_row() -> dict:
    """A task whose few-shot examples get the 135M model to call the tool turn after turn."""
    def user(text: str) -> dict:
        return {"role": "user", "content": text}

    def model(text: str) -> dict:
        return {"role": "assistant", "content": text}

    return {
        "responses_create_params": {
            "input": [
                {"role": "developer", "content": "Reply only with a tool call."},
                user("Weather in Oslo?"), model(_call("Oslo")), user(_response("Oslo")), model(_call("Lima")),
                user(_response("Lima")), model(_call("Rome")), user("Weather in Bern?"), model(_call("Bern")),
                user("Weather in Paris?"),
            ],
            "tools": TOOLS,
        }
    }


@pytest.fixture(scope="module")
def greedy() -> LocalPolicy:
    return LocalPolicy(temperature=0.0, max_new_tokens=40)


@pytest.fixture(scope="module")
def env() -> Iterator[gym.Env]:
    env = gym.make("NemoGym/example_single_tool_call-v0", max_steps=3)
    yield env
    env.close()


def _generate(policy: LocalPolicy, request: PolicyRequest):
    return background_loop().run(policy.generate(request))


@pytest.mark.timeout(1200)
def test_three_turn_episode_keeps_the_token_invariant(greedy, env):
    reward, turns, info = play(env, greedy, options={"row": _few_shot_row()})
    assert len(turns) == 3, [t.text for t in turns]
    assert info["num_tool_calls"] >= 1 and reward == 1.0  # the env took every turn's items

    seen: list[int] = []
    for turn in turns:
        assert turn.prompt_token_ids[: len(seen)] == seen  # the token invariant (docs/architecture.md, "The wire")
        assert len(turn.generation_token_ids) == len(turn.generation_log_probs) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in turn.generation_log_probs)
        assert greedy.tokenizer.decode(turn.generation_token_ids, skip_special_tokens=True) == turn.text
        seen = turn.prompt_token_ids + turn.generation_token_ids

    # What was appended each turn is what the chat template renders for the whole conversation:
    # render turn 3's conversation from scratch (ids unknown to the policy, no token data).
    history = [{k: v for k, v in item.items() if k not in ("prompt_token_ids", "generation_token_ids",
                                                              "generation_log_probs")}
               for item in env.unwrapped.episode.trajectory[:4]]
    for item in history:
        item["id"] = "foreign_" + str(item.get("id"))
    rendered = greedy.prompt_token_ids(PolicyRequest(input=_few_shot_row()["responses_create_params"]["input"],
                                                     history=history, tools=TOOLS))
    assert greedy.tokenizer.decode(rendered) == greedy.tokenizer.decode(turns[2].prompt_token_ids)


def test_sampling_is_reproducible_with_a_seed(greedy):
    request = PolicyRequest(input=[{"role": "user", "content": "Name a colour."}], history=[],
                            sampling={"temperature": 0.9, "top_p": 0.95, "max_output_tokens": 12})
    first, second = (LocalPolicy(seed=7) for _ in range(2))
    a, b = _generate(first, request), _generate(second, request)
    assert a.generation_token_ids == b.generation_token_ids and a.text == b.text
    assert a.generation_log_probs == pytest.approx(b.generation_log_probs)
    assert 0 < len(a.generation_token_ids) <= 12
    assert all(math.isfinite(lp) and lp <= 0 for lp in a.generation_log_probs)
    assert a.items and a.items[-1]["type"] == "message"


def test_generation_does_not_block_the_event_loop(greedy):
    request = PolicyRequest(input=[{"role": "user", "content": "Hi"}], history=[],
                            sampling={"max_output_tokens": 4})

    async def main() -> tuple[int, list]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        turns = await asyncio.gather(greedy.generate(request), greedy.generate(request))
        done.set()
        await task
        return ticks, turns

    ticks, turns = asyncio.run(main())
    assert ticks > 5
    assert turns[0].generation_token_ids == turns[1].generation_token_ids  # greedy, decoded together


# ---- prompts without generating ----------------------------------------------------------------


def test_first_prompt_puts_hermes_tools_in_the_system_prompt(greedy):
    assert not greedy._renderer.native_tools  # SmolLM2's template ignores tools=
    ids = greedy.prompt_token_ids(PolicyRequest(input=[{"role": "developer", "content": "Be brief."},
                                                       {"role": "user", "content": "Weather in Oslo?"}],
                                                history=[], tools=TOOLS))
    text = greedy.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '"name": "get_weather"' in text and "<tool_call>" in text
    assert text.endswith("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("ended", [True, False])
def test_next_prompt_extends_the_previous_tokens(greedy, ended):
    """Token data on the history's last model item is reused verbatim; only tool outputs are added."""
    first = greedy.prompt_token_ids(PolicyRequest(input="Weather in Oslo?", history=[], tools=TOOLS))
    end_of_turn = greedy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    generated = greedy.tokenizer(_call("Oslo"), add_special_tokens=False)["input_ids"] + ([end_of_turn] if ended else [])
    history = [
        {"type": "function_call", "id": "fc_x", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}',
         "prompt_token_ids": first, "generation_token_ids": generated, "generation_log_probs": [0.0] * len(generated)},
        {"type": "function_call_output", "call_id": "c1", "output": "cold"},
        {"type": "function_call_output", "call_id": "c2", "output": "warm"},
    ]
    ids = greedy.prompt_token_ids(PolicyRequest(input="Weather in Oslo?", history=history, tools=TOOLS))
    assert ids[: len(first) + len(generated)] == first + generated
    added = greedy.tokenizer.decode(ids[len(first) + len(generated):])
    assert added == ("" if ended else "<|im_end|>") + (
        "\n<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_native_tool_template(greedy):
    """A template that takes tools gets them as tools= and tool outputs as tool messages."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(greedy.model.name_or_path)
    tokenizer.chat_template = (
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
        "{% for m in messages %}<{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}>{{ m.content }}</s>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    renderer = _Renderer(tokenizer)
    assert renderer.native_tools
    tools = renderer.template_tools([{"type": "function", "function": {"name": "get_weather"}}])
    history = [{"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1", "output": "cold"}]
    messages = renderer.messages("Hi", history, tools)
    assert messages[-1] == {"role": "tool", "content": "cold", "tool_call_id": "c1", "name": "get_weather"}
    suffix = renderer.continuation(renderer.env_messages(history[1:], history=history), tools, "</s>")
    assert suffix == "<tool:get_weather>cold</s><assistant>"


def test_make_policy_local_and_validation(greedy):
    policy = make_policy("local", model_path=greedy.model.name_or_path, temperature=0)
    assert isinstance(policy, LocalPolicy) and policy.sampling.temperature == 0
    with pytest.raises(ValueError, match="temperature"):
        LocalPolicy(temperature=-1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        LocalPolicy(dtype="int4")
    with pytest.raises(ValueError, match="unknown policy kind"):
        make_policy("nope")
