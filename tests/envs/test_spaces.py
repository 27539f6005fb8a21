"""Tests for nemo_gym_env.envs.spaces: is_json_value, JsonItems and ResponsesAction."""

from __future__ import annotations

import copy
import pickle

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_env.envs.spaces import ALL_ITEM_TYPES, JsonItems, ResponsesAction, is_json_value
from nemo_gym_env.protocol.parser import parse_model_text

FAST = settings(max_examples=200, deadline=None)

USER = {"type": "message", "role": "user", "content": "What is 2+2?"}
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "add",
    "arguments": '{"a": 2, "b": 2}',
    "status": "completed",
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "4"}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "add"}]}


def nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------- is_json_value


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -3, 1.5, "", "ü🙂", [], {}, {"a": [1, {"b": None}]}, nested(64), np.float64(1.0)],
)
def test_is_json_value_true(value: object) -> None:
    assert is_json_value(value)


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        -float("inf"),
        (1, 2),
        {1: "a"},
        {("a",): 1},
        {"a": {1, 2}},
        b"bytes",
        object(),
        np.array([1]),
        nested(65),
        {"a": [float("nan")]},
    ],
)
def test_is_json_value_false(value: object) -> None:
    assert not is_json_value(value)


def test_is_json_value_cycle_and_depth_argument() -> None:
    cyclic: list = []
    cyclic.append(cyclic)
    assert not is_json_value(cyclic)
    assert is_json_value(nested(3), max_depth=3)
    assert not is_json_value(nested(4), max_depth=3)


# ---------------------------------------------------------------- JsonItems.contains


def test_json_items_contains_true() -> None:
    space = JsonItems()
    assert space.contains([])
    assert space.contains([USER, CALL, OUTPUT, REASONING])
    assert space.contains([{"role": "user", "content": "hi"}])  # EasyInputMessage without type
    assert [USER] in space


@pytest.mark.parametrize(
    "value",
    [
        (USER,),  # tuple instead of list
        USER,  # a dict, not a list
        "text",
        None,
        [USER, "x"],
        [{"type": "message", "role": "user", "content": float("nan")}],
        [{"type": "message", "role": "user", "content": "x", 1: "non-str key"}],
        [{"type": "message", "role": "user", "content": nested(70)}],
        [{"type": "web_search_call", "id": "ws_1"}],  # unknown type
        [{"content": "no role, no type"}],
        [{"type": "message", "role": "user", "content": (1, 2)}],
    ],
)
def test_json_items_contains_false(value: object) -> None:
    assert not JsonItems().contains(value)


def test_json_items_item_types_and_max_items() -> None:
    space = JsonItems(item_types=("message",), max_items=2)
    assert space.contains([USER, USER])
    assert not space.contains([USER, USER, USER])
    assert not space.contains([CALL])
    assert space.contains([{"role": "assistant", "content": "hi"}])
    assert not JsonItems(item_types=("function_call",)).contains([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError):
        JsonItems(item_types=())
    with pytest.raises(ValueError):
        JsonItems(max_items=-1)


# ---------------------------------------------------------------- JsonItems.sample


@pytest.mark.parametrize("seed", range(20))
def test_json_items_sample_in_space_and_deterministic(seed: int) -> None:
    a, b = JsonItems(seed=seed), JsonItems()
    b.seed(seed)
    for _ in range(5):
        sample = a.sample()
        assert isinstance(sample, list) and sample in a
        assert len(sample) <= 3
        assert sample == b.sample()


def test_json_items_sample_respects_parameters() -> None:
    space = JsonItems(item_types=("function_call_output",), max_items=1, seed=0)
    for _ in range(30):
        sample = space.sample()
        assert len(sample) <= 1 and sample in space
        assert all(item["type"] == "function_call_output" for item in sample)


def test_json_items_sample_varies_and_rejects_masks() -> None:
    space = JsonItems(seed=1)
    assert len({repr(space.sample()) for _ in range(20)}) > 5
    with pytest.raises(NotImplementedError):
        space.sample(mask=np.ones(3, dtype=np.int8))


def test_json_items_eq_repr_and_misc() -> None:
    assert JsonItems() == JsonItems(seed=3)
    assert JsonItems(max_items=2) != JsonItems()
    assert JsonItems(item_types=("message",)) != JsonItems()
    assert JsonItems() != ResponsesAction()
    assert hash(JsonItems()) == hash(JsonItems())
    assert repr(JsonItems(max_items=2)) == f"JsonItems(item_types={ALL_ITEM_TYPES!r}, max_items=2)"
    space = JsonItems()
    assert space.shape is None and space.dtype is None
    assert space.is_np_flattenable is False
    batch = [[USER], [CALL, OUTPUT]]
    assert space.from_jsonable(space.to_jsonable(batch)) == batch
    assert space.to_jsonable(batch)[0][0] is not USER
    assert pickle.loads(pickle.dumps(space)) == space
    assert copy.deepcopy(space) == space


def test_json_items_batches_as_tuple() -> None:
    batched = gymnasium.vector.utils.batch_space(JsonItems(), 3)
    assert isinstance(batched, gymnasium.spaces.Tuple) and len(batched) == 3


# ---------------------------------------------------------------- ResponsesAction


def test_action_contains_true() -> None:
    space = ResponsesAction()
    assert space.contains("")
    assert space.contains("<tool_call>{bad</tool_call>")
    assert space.contains([])
    assert space.contains(parse_model_text('<think>r</think>hi<tool_call>{"name": "f"}</tool_call>'))
    assert space.contains([{"role": "assistant", "content": "hi"}])
    assert space.contains({"object": "response", "id": "resp_1", "output": [CALL, REASONING]})


@pytest.mark.parametrize(
    "value",
    [
        None,
        3,
        b"bytes",
        (CALL,),
        [OUTPUT],  # outputs come from the environment, not the model
        [USER, "text"],
        [{"type": "message", "role": "assistant", "content": float("nan")}],
        {"output": [CALL]},  # not marked as a response
        {"object": "response", "output": (CALL,)},
        {"object": "response", "output": [OUTPUT]},
        {"object": "response", "output": [CALL], "extra": float("inf")},
    ],
)
def test_action_contains_false(value: object) -> None:
    assert not ResponsesAction().contains(value)


def test_action_contains_pydantic_models() -> None:
    from nemo_gym_env.protocol.types import FunctionCall, FunctionCallOutput, make_response

    call = FunctionCall(call_id="call_1", name="add", arguments="{}", id="fc_1", status="completed")
    space = ResponsesAction()
    assert space.contains([call])
    assert space.contains(make_response([CALL]))
    assert not space.contains([FunctionCallOutput(call_id="call_1", output="4")])


@pytest.mark.parametrize("seed", range(20))
def test_action_sample_in_space_and_deterministic(seed: int) -> None:
    a, b = ResponsesAction(tool_names=("add", "mul"), seed=seed), ResponsesAction(tool_names=("add", "mul"))
    b.seed(seed)
    for _ in range(5):
        sample = a.sample()
        assert sample in a
        assert sample == b.sample()
        assert data_equivalence(sample, sample)
        items = parse_model_text(sample) if isinstance(sample, str) else sample
        for item in items:
            if item["type"] == "function_call":
                assert item["name"] in ("add", "mul")


def test_action_sample_covers_text_items_and_calls() -> None:
    space = ResponsesAction(tool_names=("add",), seed=0)
    samples = [space.sample() for _ in range(200)]
    assert any(isinstance(s, str) for s in samples)
    assert any(isinstance(s, list) for s in samples)
    assert any(isinstance(s, str) and "<tool_call>" in s for s in samples)
    assert any(isinstance(s, list) and any(i["type"] == "function_call" for i in s) for s in samples)


def test_action_eq_repr() -> None:
    assert ResponsesAction(tool_names=("a",)) == ResponsesAction(tool_names=("a",), seed=1)
    assert ResponsesAction(tool_names=("a",)) != ResponsesAction()
    assert repr(ResponsesAction(tool_names=("a",))) == "ResponsesAction(tool_names=('a',))"
    assert ResponsesAction().is_np_flattenable is False
    with pytest.raises(NotImplementedError):
        ResponsesAction().sample(probability=np.ones(2))


@FAST
@given(st.text())
def test_action_contains_any_text(text: str) -> None:
    space = ResponsesAction()
    assert text in space
    assert parse_model_text(text) in space


# ---------------------------------------------------------------- check_env


class _EchoEnv(gymnasium.Env):
    """A tiny env on these spaces: observes the conversation, ends after two turns."""

    def __init__(self) -> None:
        self.observation_space = JsonItems()
        self.action_space = ResponsesAction(tool_names=("add",))
        self._obs: list = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[list, dict]:
        super().reset(seed=seed)
        self._obs = [{"type": "message", "role": "user", "content": f"task {self.np_random.integers(10)}"}]
        return copy.deepcopy(self._obs), {}

    def step(self, action: object) -> tuple[list, float, bool, bool, dict]:
        assert action in self.action_space
        items = parse_model_text(action, id_prefix=str(len(self._obs))) if isinstance(action, str) else action
        self._obs += items
        return copy.deepcopy(self._obs), 0.0, len(self._obs) > 3, False, {}


def test_check_env_accepts_spaces() -> None:
    check_env(_EchoEnv(), skip_render_check=True)
