"""What an OpenAI-compatible reply reports besides its items: token usage, and the token ids and
log-probs of a chat reply (vLLM's top-level ``prompt_token_ids`` and ``token_ids``, logprobs with
``token_id:N`` tokens, or NeMo Gym's fields on the message)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["chat_token_data", "float_list", "int_list", "reply_usage"]


def int_list(value: Any) -> list[int] | None:
    """``value`` if it is a list of ints (bools refused), else None."""
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def float_list(value: Any) -> list[float] | None:
    """``value`` as floats if it is a list of numbers (bools refused), else None."""
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return [float(v) for v in value]
    return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reply_usage(reply: Mapping[str, Any]) -> dict[str, int] | None:
    """``{"input_tokens", "output_tokens"}`` of a Responses or Chat Completions reply, or None.

    Example:
        >>> reply_usage({"usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
        {'input_tokens': 12, 'output_tokens': 3}
        >>> reply_usage({"usage": None}) is None
        True
    """
    usage = reply.get("usage")
    if not isinstance(usage, Mapping):
        return None
    tokens_in = _count(usage.get("input_tokens", usage.get("prompt_tokens")))
    tokens_out = _count(usage.get("output_tokens", usage.get("completion_tokens")))
    if tokens_in is None and tokens_out is None:
        return None
    return {"input_tokens": tokens_in or 0, "output_tokens": tokens_out or 0}


def chat_token_data(reply: Mapping[str, Any]) -> tuple[list[int] | None, list[int] | None, list[float] | None]:
    """``(prompt_token_ids, generation_token_ids, generation_log_probs)`` of a chat reply, each None if absent.

    Example:
        >>> chat_token_data({"prompt_token_ids": [1, 2], "choices": [{"token_ids": [3],
        ...     "logprobs": {"content": [{"token": "token_id:3", "logprob": -0.5}]}, "message": {}}]})
        ([1, 2], [3], [-0.5])
    """
    choice = (reply.get("choices") or [{}])[0] or {}
    message = choice.get("message") or {}
    prompt = int_list(reply.get("prompt_token_ids")) or int_list(message.get("prompt_token_ids"))
    generation = int_list(choice.get("token_ids")) or int_list(message.get("generation_token_ids"))
    content = ((choice.get("logprobs") or {}).get("content")) or []
    log_probs = float_list([entry.get("logprob") for entry in content if isinstance(entry, dict)]) if content else None
    if generation is None and content:
        tokens = [str(entry.get("token", "")) for entry in content if isinstance(entry, dict)]
        if tokens and all(t.startswith("token_id:") and t[9:].lstrip("-").isdigit() for t in tokens):
            generation = [int(t[9:]) for t in tokens]
    if log_probs is None:
        log_probs = float_list(message.get("generation_log_probs"))
    return prompt, generation, log_probs
