"""A bad OpenAI-compatible endpoint, as a real process on 127.0.0.1: retried where safe, else a clear failure.

Policy level: each misbehaviour of ``tests/fixtures/openai_server.py`` (HTML error pages, 429 with
``Retry-After``, connections closed mid-reply, replies that never come) is retried and then
succeeds, or fails with a :class:`PolicyError` that names it. Rollout level: ``nemo-gym-env
rollouts --policy openai`` turns every failed rollout into one row of ``rollouts_failures.jsonl``
with its reason: no hang, no lost or duplicated row.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.errors import NemoGymError, PolicyTimeout
from nemo_gym_env.policies import OpenAIPolicy, PolicyError, PolicyRequest
from nemo_gym_env.rollouts.output import failures_path
from nemo_gym_env.system.redaction import REDACTED

REQUEST = PolicyRequest(input=[{"role": "user", "content": "Weather in Oslo?"}], history=[])


def tag(knob: str) -> str:
    return f"{knob}-{uuid.uuid4().hex[:8]}"


def seen(base_url: str, model: str) -> int:
    return httpx.get(f"{base_url}/_stats").json().get(model, 0)


def generate(policy: OpenAIPolicy):
    return background_loop().run(policy.generate(REQUEST))


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("knob", ["html502-2", "cut-2", "fail429-2"])
def test_retried_then_answered(openai_base_url, api, knob):
    model = tag(knob)
    turn = generate(OpenAIPolicy(model, base_url=openai_base_url, api=api, max_retries=2))
    assert turn.items[0]["type"] == "message" and turn.output_tokens > 0
    assert seen(openai_base_url, model) == 3


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_retry_after_seconds_is_honoured(openai_base_url, api):
    model = tag("retryafter-1")
    started = time.monotonic()
    generate(OpenAIPolicy(model, base_url=openai_base_url, api=api, max_retries=1))
    assert 0.9 <= time.monotonic() - started < 5
    assert seen(openai_base_url, model) == 2


def test_slow_first_reply_times_out_then_retry_answers(openai_base_url):
    model = tag("hangfirst-1")
    turn = generate(OpenAIPolicy(model, base_url=openai_base_url, timeout_s=0.5, max_retries=1))
    assert turn.items and seen(openai_base_url, model) == 2


# ---- an attempt's timeout and a turn's deadline are two things -----------------------------------


def test_timed_out_attempts_are_retried_within_the_turns_deadline(openai_base_url):
    model = tag("hangfirst-2")
    turn = generate(OpenAIPolicy(model, base_url=openai_base_url, timeout_s=0.4, turn_timeout_s=10, max_retries=3))
    assert turn.items and seen(openai_base_url, model) == 3


def test_a_hung_endpoint_fails_the_turn_by_its_deadline_as_a_timeout(openai_base_url):
    model = tag("hang")
    started = time.monotonic()
    with pytest.raises(PolicyTimeout, match=r"no reply in time, after \d retr.*each attempt 0.4 s.*the turn 1.5 s"):
        generate(OpenAIPolicy(model, base_url=openai_base_url, timeout_s=0.4, turn_timeout_s=1.5, max_retries=50))
    assert 0.8 < time.monotonic() - started < 3  # ends by the deadline (a wait that would pass it is not begun)
    assert seen(openai_base_url, model) >= 2  # timed-out attempts were retried


def test_a_429_whose_wait_would_pass_the_deadline_fails_at_once_and_is_no_timeout(openai_base_url):
    model = tag("retryafter-99")
    started = time.monotonic()
    with pytest.raises(PolicyError) as caught:
        generate(OpenAIPolicy(model, base_url=openai_base_url, turn_timeout_s=1.5, max_retries=5))
    assert not isinstance(caught.value, PolicyTimeout) and caught.value.status_code == 429
    assert "HTTP 429 after 1 retry (a retry in 1.0 s would pass the turn's deadline of 1.5 s" in str(caught.value)
    assert time.monotonic() - started < 1.5  # the second wait is not begun
    assert seen(openai_base_url, model) == 2


def test_an_endpoint_that_refuses_every_connection_is_marked_unreachable(unused_port):
    policy = OpenAIPolicy("m", base_url=f"http://127.0.0.1:{unused_port}/v1", max_retries=1)
    with pytest.raises(PolicyError, match="cannot connect"):
        generate(policy)
    assert "refuses every connection" in policy.unreachable
    started = time.monotonic()
    with pytest.raises(PolicyError, match="refuses every connection"):
        generate(policy)  # no retry waits once it is known
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("knob,match", [
    ("html502-99", r"HTTP 502 after 1 retry: 502 Bad Gateway 502 Bad Gateway nginx \(the server failed"),
    ("cut-always", r"the connection failed before a complete reply .*after 1 retry"),
])
def test_failures_that_outlast_the_retries(openai_base_url, knob, match):
    model = tag(knob)
    with pytest.raises(PolicyError, match=match) as caught:
        generate(OpenAIPolicy(model, base_url=openai_base_url, max_retries=1))
    assert isinstance(caught.value, NemoGymError)
    assert seen(openai_base_url, model) == 2


def test_not_retried_when_the_reply_is_garbage_or_a_client_error(openai_base_url):
    for knob in ("garbage", "echo-key"):
        model = tag(knob)
        with pytest.raises(PolicyError):
            generate(OpenAIPolicy(model, base_url=openai_base_url, max_retries=3))
        assert seen(openai_base_url, model) == 1


@pytest.mark.parametrize("key", ["k", "ab", "Q7x"])
def test_short_keys_are_hidden_without_scrubbing_words(openai_base_url, key):
    """A 1-3 character key is masked where it stands alone, not inside every word that contains it."""
    policy = OpenAIPolicy(tag("echo-key"), base_url=openai_base_url, api_key=key, max_retries=0)
    with pytest.raises(PolicyError) as caught:
        generate(policy)
    text = str(caught.value)
    assert f"Incorrect API key provided: {REDACTED}" in text
    assert "check policy_api_key" in text and "OpenAI-compatible endpoint" in text  # words intact
    assert f" {key} " not in f" {text} " and not text.endswith(f": {key}")


# ---- rollouts: failure rows ------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_endpoints_give_one_failure_row_per_rollout(openai_base_url, tmp_path):
    from tests.cli.conftest import read_jsonl, run_cli

    cases = {"cut-always": ("connection failed before a complete reply", "60"), "html502-999": ("HTTP 502", "60"),
             "garbage": ("malformed reply", "60"), "hang": ("the turn 1 s (turn_timeout_s / --turn-timeout)", "1")}
    for knob, (reason, turn_timeout) in cases.items():
        out = tmp_path / knob / "rollouts.jsonl"
        started = time.monotonic()
        result = run_cli("rollouts", "example_single_tool_call", "--policy", "openai", "--base-url", openai_base_url,
                         "--model", tag(knob), "--limit", "3", "--num-repeats", "2", "--turn-timeout", turn_timeout,
                         "--first-reply-timeout", "1", "-o", str(out), "--no-env-yaml", timeout=180)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert time.monotonic() - started < 120
        failures = read_jsonl(failures_path(out))
        keys = sorted((f["_ng_task_index"], f["_ng_rollout_index"]) for f in failures)
        assert keys == [(t, r) for t in range(3) for r in range(2)]  # every rollout once, none twice
        assert all(f["_ng_failure_class"] in ("policy_error", "policy_timeout") for f in failures)
        assert all(reason in f["failure_reason"] for f in failures), (knob, failures[0]["failure_reason"])
        assert not out.exists() or not read_jsonl(out)


@pytest.mark.slow
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_flaky_endpoint_rollouts_all_succeed_with_usage(openai_base_url, tmp_path, api):
    from tests.cli.conftest import read_jsonl, run_cli

    out = tmp_path / "rollouts.jsonl"
    result = run_cli("rollouts", "example_single_tool_call", "--policy", "openai", "--base-url", openai_base_url,
                     "--model", tag("cut-2"), "--api", api, "--limit", "4", "-o", str(out), "--no-env-yaml",
                     timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = read_jsonl(out)
    assert sorted(r["_ng_task_index"] for r in rows) == [0, 1, 2, 3] and all(r["reward"] == 1.0 for r in rows)
    for row in rows:
        usage = row["response"]["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert not failures_path(out).exists() or not read_jsonl(failures_path(out))


@pytest.mark.slow
def test_a_429_is_waited_out_by_default_and_never_reported_as_a_timeout(openai_base_url, tmp_path):
    from tests.cli.conftest import read_jsonl, run_cli

    def rollouts(model: str, out, *more: str):
        return run_cli("rollouts", "example_single_tool_call", "--policy", "openai", "--base-url", openai_base_url,
                       "--model", model, "--limit", "4", "-o", str(out), "--no-env-yaml", *more, timeout=180)

    out = tmp_path / "waited" / "rollouts.jsonl"
    result = rollouts(tag("retryafter-2"), out)  # two 429s with Retry-After: 1, then answers
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["reward"] for r in read_jsonl(out)] == [1.0] * 4

    out = tmp_path / "tight" / "rollouts.jsonl"
    result = rollouts(tag("retryafter-999"), out, "--turn-timeout", "1.5")  # every answer a 429, waits past the deadline
    assert result.returncode == 1 and "Traceback" not in result.stderr
    failures = read_jsonl(failures_path(out))
    assert len(failures) == 4 and {f["_ng_failure_class"] for f in failures} == {"policy_error"}
    for failure in failures:
        assert "HTTP 429 after 1 retry (a retry in 1.0 s would pass the turn's deadline of 1.5 s" in failure["failure_reason"]
        assert "the endpoint is rate limiting" in failure["failure_reason"]


@pytest.mark.slow
def test_a_hung_endpoint_is_waited_for_once_then_fails_each_rollout_in_30_s_by_default(openai_base_url, tmp_path):
    import subprocess

    from tests.cli.conftest import CLI, cli_env, read_jsonl

    out = tmp_path / "rollouts.jsonl"
    model = tag("hang")
    proc = subprocess.Popen([*CLI, "rollouts", "example_single_tool_call", "--policy", "openai", "--base-url",
                             openai_base_url, "--model", model, "--limit", "2", "--first-reply-timeout", "3",
                             "-o", str(out), "--no-env-yaml"],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, asked, began = [], None, None
    for line in proc.stderr:  # the clocks start when the rollouts do (start-up is not the endpoint's)
        lines.append(line)
        if asked is None and " to run: " in line:
            asked = time.monotonic()
        if began is None and "no first reply from" in line:
            began = time.monotonic()
    proc.wait(180)
    assert proc.returncode == 1 and asked is not None and began is not None, "".join(lines)
    assert 3 <= began - asked < 3 + 5  # the one generous wait, by --first-reply-timeout
    assert any("waiting for the endpoint's first reply" in line for line in lines)  # said while it waits
    assert f"no first reply from openai:responses:{model} in 3 s; the rollouts go on under the per-turn limits" in "".join(lines)
    elapsed = time.monotonic() - began
    failures = read_jsonl(failures_path(out))
    assert len(failures) == 2 and {f["_ng_failure_class"] for f in failures} == {"policy_timeout"}
    reason = failures[0]["failure_reason"]
    assert "no reply in time, after 1 retry" in reason  # the timed-out attempt was retried
    assert "each attempt 20 s (timeout_s / --attempt-timeout), the turn 30 s (turn_timeout_s / --turn-timeout)" in reason
    assert 20 < elapsed < 30 + 10, elapsed  # the default deadline, and the command's own end


@pytest.mark.slow
def test_an_endpoint_that_refuses_every_connection_stops_the_run_with_one_line(unused_port, tmp_path):
    from tests.cli.conftest import read_jsonl, run_cli

    out = tmp_path / "rollouts.jsonl"
    result = run_cli("rollouts", "example_single_tool_call", "--policy", "openai", "--base-url",
                     f"http://127.0.0.1:{unused_port}/v1", "--model", "m", "--num-repeats", "10", "-o", str(out),
                     "--no-env-yaml", timeout=180)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert f"127.0.0.1:{unused_port}/v1 (model 'm', responses API) refuses every connection" in errors[0]
    assert "Stopped the run after" in errors[0] and "--resume" in errors[0]
    failures = read_jsonl(failures_path(out))
    assert 1 <= len(failures) <= 8 < 50  # the first turns in flight, not all 50 rollouts one by one
    assert all("cannot connect" in f["failure_reason"] for f in failures)
