"""What NeMo RL reads from a result, checked explicitly; shared by the NeMo RL adapter's tests.

The layout is checked explicitly (no jsonschema) against what NeMo RL's
``_postprocess_nemo_gym_to_nemo_rl_result`` builds and its GRPO consumes; the consumer
simulation (``nemo_rl_consume``) reproduces what NeMo RL does with a batch of results.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest

from nemo_gym_env.adapters.nemo_rl import check_nemo_rl_result
from nemo_gym_env.policies import PolicyTurn

# ---- the layout, explicitly ------------------------------------------------------------------


def assert_layout(result: dict[str, Any]) -> None:
    """Every rule of the result layout, checked one by one (lists or tensors)."""
    assert set(result) >= {"message_log", "input_message_log", "full_result"}
    log = result["message_log"]
    assert isinstance(log, list) and log and len(log) % 2 == 0
    for i, message in enumerate(log):
        assert message["role"] == ("user" if i % 2 == 0 else "assistant"), f"message {i} breaks the alternation"
        assert message["content"] == ""
        tokens = as_list(message["token_ids"])
        assert tokens and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens)
        if message["role"] == "assistant":
            log_probs = as_list(message["generation_logprobs"])
            assert len(log_probs) == len(tokens)
            assert all(isinstance(lp, float) and math.isfinite(lp) for lp in log_probs)
            assert isinstance(message["is_invalid_tool_call"], bool)
            assert isinstance(message["has_malformed_thinking"], bool)
        else:
            assert "generation_logprobs" not in message
    assert len(result["input_message_log"]) == 1
    assert as_list(result["input_message_log"][0]["token_ids"]) == as_list(log[0]["token_ids"])
    assert isinstance(result["full_result"]["reward"], float)
    check_nemo_rl_result(result)  # the adapter's own check agrees


def as_list(value: Any) -> list:
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
