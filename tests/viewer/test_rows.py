"""A row's list columns, and the scrubbing of everything the viewer serves."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from nemo_gym_env.system.redaction import REDACTED
from nemo_gym_env.viewer.rows import MAX_DEPTH, Scrubber, count_tokens, count_turns, row_stats
from nemo_gym_env.viewer.run import env_yaml_secrets
from tests.viewer.rollout_data import built_row, failure_row


def test_turns_are_runs_of_model_items_between_environment_items():
    call, out = {"type": "function_call"}, {"type": "function_call_output"}
    say, think = {"type": "message", "role": "assistant"}, {"type": "reasoning"}
    assert count_turns([]) == 0
    assert count_turns([say]) == 1
    assert count_turns([think, call, call, out, out, think, say]) == 2
    assert count_turns([call, out, call, out, call, out, say]) == 4
    assert count_turns([{"type": "message", "role": "user"}, say]) == 1


def test_tokens_from_usage_else_generated_ids_else_blank():
    row = built_row(0, 0, 1.0)
    assert count_tokens(row) == 80 + 17
    row["response"]["usage"] = None
    assert count_tokens(row) == 12 + 5
    for item in row["response"]["output"]:
        item.pop("generation_token_ids", None)
    assert count_tokens(row) is None
    assert count_tokens({"response": {"usage": {"input_tokens": 3}}}) is None


def test_columns_of_odd_rows_are_blank_not_errors():
    assert row_stats({}) == row_stats({"response": "nope", "agent_ref": ["x"], "reward": "1"})
    odd = row_stats({"_ng_task_index": True, "reward": True, "response": {"output": [1, "x", None]}})
    assert odd.task is None and odd.reward == 1.0 and odd.turns == 0 and odd.tool_calls == 0
    assert row_stats({"reward": float("nan")}).reward is None
    failed = row_stats(failure_row(2, 1, "math", "server said 500"))
    assert (failed.server, failed.task, failed.rollout, failed.reward) == ("math", 2, 1, None)
    assert failed.failure == "policy_timeout: server said 500"
    assert row_stats({"failure_kind": "infra", "mask_sample": True}).failure == "infra"


def test_scrubber_masks_known_secrets_and_credentials_everywhere():
    secret = "hunter2-is-the-key"
    scrub = Scrubber([secret, "abc"])  # too short to mask: would eat ordinary words
    value = scrub.value({
        "text": f"the key is {secret}!",
        secret: "as a key",
        "nested": [{"auth": "Authorization: Bearer abc.def.ghi"}, "https://user:pw@host/x",
                   "sk-" + "a" * 30],
        "abc": "abc",
    })
    dumped = json.dumps(value)
    assert secret not in dumped and "pw@" not in dumped and "abc.def" not in dumped and "sk-aaa" not in dumped
    assert value["text"] == f"the key is {REDACTED}!"
    assert value[REDACTED] == "as a key"
    assert value["abc"] == "abc"


def test_scrubber_makes_any_value_json_safe():
    deep: list = []
    node = deep
    for _ in range(MAX_DEPTH + 20):
        node.append([])
        node = node[0]
    value = Scrubber().value({"inf": math.inf, "ninf": -math.inf, "nan": math.nan, "big": 2**80, "ok": 2**53,
                              "deep": deep})
    assert value["inf"] == "Infinity" and value["ninf"] == "-Infinity" and value["nan"] == "NaN"
    assert value["big"] == str(2**80) and value["ok"] == 2**53
    text = json.dumps(value, allow_nan=False)  # what the reply encoder demands
    assert "nested deeper than" in text


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=40))
def test_any_parsed_json_scrubs_to_strict_json(value):
    json.dumps(Scrubber(["secret-value"]).value(value), allow_nan=False)


def test_env_yaml_secrets_are_the_values_under_secret_keys(tmp_path):
    env = tmp_path / "env.yaml"
    env.write_text("policy_base_url: http://127.0.0.1:8000/v1\npolicy_api_key: sk-live-0123456789abcdefghij\n"
                   "policy_model_name: m\nnested:\n  hf_token: hf_abcdef\n  max_output_tokens: 64\n")
    assert sorted(env_yaml_secrets(env)) == ["hf_abcdef", "sk-live-0123456789abcdefghij"]
    assert env_yaml_secrets(tmp_path / "missing.yaml") == []
