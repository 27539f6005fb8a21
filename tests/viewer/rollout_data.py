"""Rollout files for the viewer tests: real episodes played through the env, and rows built by hand.

Played rows are what ``nemo-gym-env rollouts`` writes (the ``/verify`` reply plus the two
index keys and ``agent_ref``), produced by the bundled servers and their scripted players,
right and wrong in turn, so that groups hold rewards 1.0 and 0.0. Built rows carry what the
bundled servers never send: reasoning, token ids, usage, reward components, hostile strings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym

from nemo_gym_env.envs.registration import env_id
from nemo_gym_env.rollouts.output import RolloutWriter
from tests.conftest import play_episode

HOSTILE = [
    "<script>window.__pwned = (window.__pwned || 0) + 1; alert('script')</script>",
    '<img src=x onerror="window.__pwned = (window.__pwned || 0) + 1; alert(\'img\')">',
    "javascript:window.__pwned=(window.__pwned||0)+1;alert('js-url')",
    '"><svg onload="window.__pwned=(window.__pwned||0)+1">',
]
"""Strings that would run code if a page put them in as markup or as a link."""


def played_rows(server: str, *, tasks: int, repeats: int) -> list[dict[str, Any]]:
    """Rollout rows of real episodes: tasks 0..tasks-1, each ``repeats`` times, right on even rollouts."""
    rows = []
    env = gym.make(env_id(server))
    try:
        for task in range(tasks):
            for rollout in range(repeats):
                play_episode(env, server, correct=rollout % 2 == 0, options={"task_index": task})
                row = dict(env.unwrapped.last_verify)
                row.update({"_ng_task_index": task, "_ng_rollout_index": rollout,
                            "agent_ref": {"type": "resources_servers", "name": server}})
                rows.append(row)
    finally:
        env.close()
    return rows


def built_row(task: int, rollout: int, reward: float, *, server: str = "built", text: str = "What is 6 times 7?",
              tool_output: str = '{"result": 42}', answer: str = "42", **extra: Any) -> dict[str, Any]:
    """A rollout row with every kind of item: reasoning, a tool call and its output, token ids, usage."""
    return {
        "responses_create_params": {
            "input": [
                {"type": "message", "role": "system", "content": "You are a calculator. Use the tool."},
                {"type": "message", "role": "user", "content": text},
            ],
            "tools": [{"type": "function", "name": "multiply", "description": "a times b",
                       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                      "required": ["a", "b"]}}],
        },
        "response": {
            "id": f"resp_{task}_{rollout}", "object": "response", "created_at": 0, "model": "built",
            "output": [
                {"type": "reasoning", "id": "rs_0", "summary": [{"type": "summary_text", "text": "I should multiply."}]},
                {"type": "function_call", "id": "fc_0", "call_id": "call_0", "name": "multiply",
                 "arguments": json.dumps({"a": 6, "b": 7}), "prompt_token_ids": [1] * 30,
                 "generation_token_ids": [2] * 12, "generation_log_probs": [-0.5] * 12},
                {"type": "function_call_output", "call_id": "call_0", "output": tool_output},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": answer, "annotations": []}],
                 "prompt_token_ids": [1] * 50, "generation_token_ids": [2] * 5, "generation_log_probs": [-0.1] * 5},
            ],
            "usage": {"input_tokens": 80, "output_tokens": 17},
        },
        "expected_answer": "42",
        "extracted_answer": answer,
        "reward": reward,
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"type": "resources_servers", "name": server},
        **extra,
    }


def failure_row(task: int, rollout: int, server: str, reason: str) -> dict[str, Any]:
    """A failed rollout as ``rollouts`` puts it in the sidecar."""
    return {"_ng_failure_class": "policy_timeout", "failure_reason": reason, "server_url": "http://127.0.0.1:9",
            "_ng_task_index": task, "_ng_rollout_index": rollout,
            "agent_ref": {"type": "resources_servers", "name": server}}


def write_rows(path: Path, rows: list[dict[str, Any]], failures: list[dict[str, Any]] = ()) -> Path:
    """Write rows (and failures, to the sidecar) with the writer ``rollouts`` uses."""
    with RolloutWriter(path) as writer:
        for row in [*rows, *failures]:
            writer.write(row)
    return path


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join((json.dumps(row) + "\n").encode() for row in rows)
