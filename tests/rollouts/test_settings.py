"""The settings of a rollouts run (``rollouts.settings.RolloutSettings``): defaults, and checks whose
messages name the command-line flag of the field at fault."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from nemo_gym_env.cli import build_parser
from nemo_gym_env.errors import NemoGymError, UsageError
from nemo_gym_env.rollouts.settings import (
    DEFAULT_CONCURRENCY,
    DEFAULT_OUTPUT,
    LOCAL_DEFAULTS,
    RolloutSettings,
)


def _rollouts_flags() -> set[str]:
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {flag for action in commands.choices["rollouts"]._actions for flag in action.option_strings}


def test_defaults_are_valid():
    settings = RolloutSettings()
    assert (settings.output, settings.num_repeats, settings.concurrency, settings.max_steps) == (
        DEFAULT_OUTPUT, 1, None, 16)  # concurrency: the policy's default, filled in by for_policy
    assert (settings.api, settings.timeout, settings.env_yaml) == ("responses", 120.0, "env.yaml")
    assert settings.sampling == {}


def test_for_policy_fills_in_only_what_is_unset():
    assert RolloutSettings().for_policy("openai").concurrency == DEFAULT_CONCURRENCY
    endpoint = RolloutSettings().for_policy("openai")
    assert (endpoint.attempt_timeout, endpoint.turn_timeout) == (20.0, 30.0)  # a hung endpoint: 30 s a rollout
    assert RolloutSettings(turn_timeout=600).for_policy("openai").turn_timeout == 600
    for kind in ("local", "scripted"):  # no deadline unless asked: a slow machine is not a hung endpoint
        assert RolloutSettings().for_policy(kind).turn_timeout is None
    assert RolloutSettings().for_policy("local").max_episode_tokens == LOCAL_DEFAULTS["max_episode_tokens"] == 512
    assert RolloutSettings().for_policy("openai").max_episode_tokens is None
    assert RolloutSettings().for_policy("scripted").sampling == {}
    local = RolloutSettings().for_policy("local")
    assert local.concurrency == LOCAL_DEFAULTS["concurrency"]
    assert local.sampling == {"temperature": 0.0, "max_output_tokens": LOCAL_DEFAULTS["max_output_tokens"]}
    mine = RolloutSettings(concurrency=3, temperature=0.7, max_output_tokens=9).for_policy("local")
    assert (mine.concurrency, mine.sampling) == (3, {"temperature": 0.7, "max_output_tokens": 9})


def test_sampling_holds_only_the_overrides_that_are_set():
    assert RolloutSettings(temperature=0.0).sampling == {"temperature": 0.0}
    settings = RolloutSettings(top_p=0.9, max_output_tokens=77)
    assert settings.sampling == {"top_p": 0.9, "max_output_tokens": 77}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_repeats", 0, "--num-repeats must be >= 1, got 0"),
        ("concurrency", -3, "--concurrency must be >= 1, got -3"),
        ("limit", 0, "--limit must be >= 1, got 0"),
        ("max_steps", 0, "--max-steps must be >= 1, got 0"),
        ("max_output_tokens", 0, "--max-output-tokens must be >= 1, got 0"),
        ("timeout", 0, "--timeout must be > 0, got 0"),
        ("timeout", -1.5, "--timeout must be > 0, got -1.5"),
        ("turn_timeout", 0.0, "--turn-timeout must be > 0, got 0.0"),
        ("attempt_timeout", -1, "--attempt-timeout must be > 0, got -1"),
        ("max_episode_tokens", 0, "--max-episode-tokens must be >= 1, got 0"),
        ("server_url", "localhost:1", "--server-url must be an http:// or https:// URL, got 'localhost:1'"),
        ("head_url", "ftp://h", "--head-url must be an http:// or https:// URL, got 'ftp://h'"),
        ("base_url", "h:8000/v1", "--base-url must be an http:// or https:// URL, got 'h:8000/v1'"),
        ("api", "completions", "--api must be 'responses' or 'chat', got 'completions'"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_flag(field, value, message):
    with pytest.raises(UsageError) as refused:
        RolloutSettings(**{field: value})
    assert str(refused.value) == message
    assert isinstance(refused.value, NemoGymError)
    flag = message.split()[0]
    assert flag in _rollouts_flags(), f"{flag} is not a flag of nemo-gym-env rollouts"


def test_the_smallest_good_values_pass():
    settings = RolloutSettings(num_repeats=1, concurrency=1, limit=1, max_steps=1, max_output_tokens=1,
                               timeout=0.001, turn_timeout=0.001, server_url="https://h", base_url="http://h/v1",
                               api="chat")
    assert settings.limit == 1 and settings.api == "chat"


def test_head_url_and_server_url_together_name_both_flags():
    with pytest.raises(UsageError, match=r"^give --head-url or --server-url, not both$"):
        RolloutSettings(head_url="http://127.0.0.1:1", server_url="http://127.0.0.1:2")


def test_every_flag_a_message_can_name_is_a_field():
    """The messages spell a field as its flag (``num_repeats`` -> ``--num-repeats``): each flag
    of ``rollouts`` that stands for a field has the field's name."""
    fields = {f.name for f in dataclasses.fields(RolloutSettings)}
    flags = {re.sub(r"^--", "", f).replace("-", "_") for f in _rollouts_flags() if f.startswith("--")}
    checked = {"num_repeats", "concurrency", "limit", "max_steps", "max_output_tokens", "timeout",
               "attempt_timeout", "turn_timeout", "max_episode_tokens", "server_url", "head_url", "base_url", "api"}
    assert checked <= fields and checked <= flags


def test_episode_reward_is_checked_and_a_resume_with_another_is_a_difference(tmp_path):
    from nemo_gym_env.rollouts.manifest import RunManifest, differences, read_manifest, write_manifest

    with pytest.raises(UsageError, match="--episode-reward must be 'verify' or 'sum', got 'mean'"):
        RolloutSettings(episode_reward="mean")
    old = RunManifest(num_repeats=1, policy={"kind": "scripted"}, sampling={})
    new = dataclasses.replace(old, episode_reward="sum")
    assert differences(old, new) == ["--episode-reward was verify, now sum"]
    # A manifest written before the option existed holds no such key: it was a /verify-reward run.
    path = tmp_path / "rollouts_run.json"
    path.write_text('{"num_repeats": 1, "policy": {"kind": "scripted"}, "sampling": {}, "inputs": {}, "format": 1}')
    assert read_manifest(tmp_path / "rollouts.jsonl").episode_reward == "verify"
    write_manifest(tmp_path / "rollouts.jsonl", new)
    assert read_manifest(tmp_path / "rollouts.jsonl") == new


def test_the_local_policy_takes_the_native_dtype_unless_told():
    assert RolloutSettings().for_policy("local").dtype == LOCAL_DEFAULTS["dtype"] == "auto"
    assert RolloutSettings(dtype="float32").for_policy("local").dtype == "float32"
    assert RolloutSettings().for_policy("openai").dtype is None
    args = build_parser().parse_args(["rollouts", "--dtype", "int8"])
    assert args.dtype == "int8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rollouts", "--dtype", "int4"])
