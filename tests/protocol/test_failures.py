"""The line between a reward and a failure that is no reward (``protocol.failures``)."""

from __future__ import annotations

import pytest

from nemo_gym_env.protocol.failures import INFRASTRUCTURE_KINDS, TASK_KINDS, is_reward, verdict_failure

# Every failure_kind a bundled server (or the server kit) gives, and whose fault it is.
MODEL = ["wrong_answer", "syntax_error", "runtime_error", "timeout", "memory", "output_limit", "forbidden",
         "no_code", "no_answer", "answer_too_long", "response_too_long"]
INFRASTRUCTURE = ["verify_timeout", "score_timeout", "scorer_error", "sandbox_lost", "verifier_error",
                  "invalid_reward"]
TASK = ["unknown_task", "invalid_task_config", "task_mismatch", "invalid_instruction"]


@pytest.mark.parametrize("kind", MODEL)
def test_the_model_s_faults_stay_rewards(kind):
    assert verdict_failure({"reward": 0.0, "failure_kind": kind, "failure_reason": "x"}) is None
    assert is_reward({"reward": 0.0, "failure_kind": kind})


@pytest.mark.parametrize("kind", INFRASTRUCTURE + TASK)
def test_what_is_not_the_model_s_fault_is_no_reward(kind):
    found, reason = verdict_failure({"reward": 0.0, "failure_kind": kind, "failure_reason": "why"})
    assert found == kind and reason.endswith(": why")
    assert ("task row" in reason) == (kind in TASK)
    assert not is_reward({"reward": 1.0, "failure_kind": kind})  # whatever number came with it


def test_the_lists_are_the_documented_ones():
    assert set(INFRASTRUCTURE) == INFRASTRUCTURE_KINDS and set(TASK) == TASK_KINDS
    assert not set(MODEL) & (INFRASTRUCTURE_KINDS | TASK_KINDS)


def test_mask_sample_is_no_reward_whatever_the_kind():
    assert verdict_failure({"reward": 0.0, "mask_sample": True}) == (
        "masked", "masked (infrastructure; no reward): the verifier marked the sample masked (mask_sample: true)")
    assert verdict_failure({"reward": 0.0, "mask_sample": True, "failure_kind": "judge_failed"})[0] == "judge_failed"
    assert is_reward({"reward": 0.0, "mask_sample": False}) and is_reward({"reward": 1.0})
    assert is_reward({"reward": 0.0, "mask_sample": "yes"})  # not a bool: the client refuses such a reply itself
    assert is_reward({"reward": 0.0, "failure_kind": None}) and is_reward({"reward": 0.0, "failure_kind": ""})
