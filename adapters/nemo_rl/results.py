"""One finished episode as NeMo RL's result dict, with every invariant NeMo RL asserts checked up front.

The layout, as NeMo RL builds it (``_postprocess_nemo_gym_to_nemo_rl_result``): one
``{"role": "user", "content": "", "token_ids": new prompt tokens}`` and one
``{"role": "assistant", "content": "", "token_ids": generated tokens, "generation_logprobs":
[...]}`` per model call, the user message holding only the prompt tokens not seen before;
``input_message_log`` is ``message_log[:1]``; ``full_result`` is the ``/verify`` reply with the
token fields taken off its items. A model call whose generation is empty is skipped, as NeMo RL
skips it (its prompt tokens then open the next user message).

Example (no NeMo RL needed)::

    env.reset(seed=0); ...                          # play with a policy returning token data
    result = to_nemo_rl_result(env.unwrapped.episode)
    [m["role"] for m in result["message_log"]]      # ['user', 'assistant', 'user', 'assistant']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from nemo_gym_env.errors import NemoRLFormatError
from nemo_gym_env.protocol.items import plain, without_token_fields
from nemo_gym_env.protocol.keys import TOKEN_FIELDS

__all__ = [
    "INVALID_TOOL_CALL_PATTERNS",
    "THINKING_TAGS",
    "TOKEN_FIELDS",
    "TokenTurn",
    "check_nemo_rl_result",
    "to_nemo_rl_result",
    "token_turns",
]

INVALID_TOOL_CALL_PATTERNS = ("<tool_call>", "</tool_call>", "<function_call>", "</function_call>")
"""Text that marks a tool call the env could not parse (NeMo RL's defaults)."""

THINKING_TAGS = ("<think>", "</think>")
"""Think tags checked for malformed thinking (NeMo RL's defaults)."""


@dataclass(frozen=True)
class TokenTurn:
    """One model call's token data (and, when known, the output item that carried it).

    Attributes:
        prompt_token_ids: Everything the model saw in this call.
        generation_token_ids: What it generated.
        generation_log_probs: The log-probability of each generated token.
        item: The Responses item carrying the fields (for the invalid-tool-call flags), or None.
        where: How errors name this turn's source (``output item 5``).
    """

    prompt_token_ids: Sequence[Any] | None
    generation_token_ids: Sequence[Any] | None
    generation_log_probs: Sequence[Any] | None
    item: Mapping[str, Any] | None = None
    where: str = ""


def _items_of(source: Any) -> tuple[list[Any], Mapping[str, Any] | None]:
    """``(items or turns, verify reply if the source has one)`` of any accepted source."""
    if hasattr(source, "unwrapped") and getattr(source.unwrapped, "episode", None) is not None:  # an env
        source = source.unwrapped.episode
    if hasattr(source, "trajectory") and hasattr(source, "last_verify"):  # an Episode
        verdict = source.verdict() if hasattr(source, "verdict") else source.last_verify
        return list(source.trajectory), verdict
    source = plain(source)
    if isinstance(source, Mapping):
        if isinstance(source.get("response"), Mapping):  # a /verify reply (NeMo Gym rollout row)
            return list(source["response"].get("output") or []), source
        if isinstance(source.get("output"), list):  # a Response
            return list(source["output"]), None
        raise NemoRLFormatError(
            "expected an Episode, a /verify reply, a Response or a list of turns; got a mapping with keys "
            f"{sorted(source)[:8]}"
        )
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise NemoRLFormatError(f"expected an Episode, a /verify reply, a Response or a list of turns; got "
                                f"{type(source).__name__}")
    return list(source), None


def token_turns(source: Any) -> list[TokenTurn]:
    """The model calls of an episode, in order: every item or turn that carries token data.

    Args:
        source: A :class:`~nemo_gym_env.envs.env.NemoGymEnv` or its ``Episode`` (``env.unwrapped.episode``), a
            ``/verify`` reply (its ``response.output``), a ``Response`` (``env.unwrapped.response``),
            a list of Responses items, or a list of turns (:class:`~nemo_gym_env.policies.base.PolicyTurn`
            objects or dicts with the three token fields).

    Items without any token field (tool outputs, the earlier items of a call) are not turns.
    """
    entries, _ = _items_of(source)
    turns = []
    for position, raw in enumerate(entries):
        if hasattr(raw, "generation_token_ids") and hasattr(raw, "items"):  # a PolicyTurn
            items = list(raw.items or [])
            turns.append(TokenTurn(raw.prompt_token_ids, raw.generation_token_ids, raw.generation_log_probs,
                                   plain(items[-1]) if items else None, f"turn entry {position}"))
            continue
        entry = plain(raw)
        if not isinstance(entry, Mapping):
            raise NemoRLFormatError(f"entry {position} is a {type(entry).__name__}, not an item or a turn")
        if not any(entry.get(k) is not None for k in TOKEN_FIELDS):
            continue
        kind = "output item" if "type" in entry else "turn entry"
        turns.append(TokenTurn(entry.get("prompt_token_ids"), entry.get("generation_token_ids"),
                               entry.get("generation_log_probs"), entry if "type" in entry else None,
                               f"{kind} {position}"))
    return turns


def _token_list(value: Any, what: str, where: str) -> list[int]:
    if hasattr(value, "tolist"):  # a tensor or an array
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise NemoRLFormatError(f"{where}: {what} must be a list of token ids, got {type(value).__name__}")
    out = []
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, Integral) or token < 0:
            raise NemoRLFormatError(f"{where}: {what}[{i}] = {token!r} is not a token id (a non-negative int)")
        out.append(int(token))
    return out


def _log_probs(value: Any, length: int, where: str) -> list[float]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise NemoRLFormatError(f"{where}: generation_log_probs must be a list of floats, got {type(value).__name__}; "
                                "the policy must return log-probabilities (vLLM: logprobs=True)")
    if len(value) != length:
        raise NemoRLFormatError(f"{where}: {len(value)} generation_log_probs for {length} generation_token_ids; "
                                "they must be the same length (one log-probability per generated token)")
    out = []
    for i, lp in enumerate(value):
        if isinstance(lp, bool) or not isinstance(lp, Real) or not math.isfinite(lp):
            raise NemoRLFormatError(f"{where}: generation_log_probs[{i}] = {lp!r} is not a finite number")
        out.append(float(lp))
    return out


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _flags(item: Mapping[str, Any] | None, patterns: Sequence[str], tags: Sequence[str]) -> tuple[bool, bool]:
    """``(is_invalid_tool_call, has_malformed_thinking)`` of a call's last item (NeMo RL's penalty flags).

    Tool-call markup left in text means a call the env could not parse (so never ran); think
    tags in a final message, or repeated in a reasoning summary, mean malformed thinking.
    """
    if not item:
        return False, False
    if item.get("type") == "reasoning":
        text = " ".join(str(p.get("text", "")) for p in item.get("summary") or [] if isinstance(p, Mapping))
        return any(p in text for p in patterns), any(text.count(t) > 1 for t in tags)
    if item.get("type", "message") == "message":
        parts = item.get("content")
        text = parts if isinstance(parts, str) else " ".join(
            str(p.get("text", "")) for p in parts or [] if isinstance(p, Mapping))
        return any(p in text for p in patterns), any(t in text for t in tags)
    return False, False


def _check_reward(full_result: Mapping[str, Any]) -> float:
    reward = full_result.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, Real) or not math.isfinite(reward):
        raise NemoRLFormatError(f"full_result['reward'] must be a finite number, got {reward!r}; "
                                "pass the server's /verify reply as full_result")
    components = full_result.get("reward_components")
    if components:  # NeMo RL treats a missing or empty mapping as a single-reward result
        if not isinstance(components, Mapping):
            raise NemoRLFormatError(f"reward_components must map names to numbers, got {type(components).__name__}")
        for name, value in components.items():
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
                raise NemoRLFormatError(f"reward_components[{name!r}] = {value!r} is not a finite number")
        total = sum(float(v) for v in components.values())
        if not math.isclose(float(reward), total, rel_tol=1e-5, abs_tol=1e-6):
            raise NemoRLFormatError(
                f"reward is {reward} but reward_components sum to {total} ({dict(components)}); the verifier "
                "must set reward = sum(reward_components) (NeMo RL's GRPO and GDPO read both)")
    return float(reward)


def _step_rewards(full_result: Mapping[str, Any], num_turns: int) -> list[float] | None:
    """The verdict's per-turn step rewards (one per model call), or None when the server gave none."""
    values = full_result.get("step_rewards")
    if values is None:
        return None
    if not isinstance(values, (list, tuple)):
        raise NemoRLFormatError(f"step_rewards must be a list of numbers (one per turn), got {type(values).__name__}")
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise NemoRLFormatError(f"step_rewards[{i}] = {value!r} is not a finite number")
    if len(values) != num_turns:
        raise NemoRLFormatError(f"{len(values)} step_rewards for {num_turns} model calls with token data; "
                                "there is one step reward per model turn")
    return [float(v) for v in values]


def _without_token_fields(full_result: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the verify reply whose output items no longer carry the (now duplicated) token fields."""
    out = dict(full_result)
    response = out.get("response")
    if isinstance(response, Mapping) and isinstance(response.get("output"), list):
        out["response"] = {**response, "output": [without_token_fields(item) for item in response["output"]]}
    return out


def to_nemo_rl_result(
    source: Any,
    full_result: Mapping[str, Any] | None = None,
    *,
    tensors: bool = False,
    invalid_tool_call_patterns: Sequence[str] | None = None,
    thinking_tags: Sequence[str] | None = None,
) -> dict[str, Any]:
    """NeMo RL's result dict of one finished episode; pure (the inputs are not changed).

    Args:
        source: The episode's turns, as :func:`token_turns` accepts them (an ``Episode``, a
            ``/verify`` reply, a ``Response``, a list of items or of turns).
        full_result: The ``/verify`` reply (with ``reward``); taken from ``source`` when it is an
            ``Episode`` or a verify reply.
        tensors: Token ids and log-probs as torch tensors (what NeMo RL's own actor yields)
            instead of lists.
        invalid_tool_call_patterns: Text that marks an unparsed tool call (NeMo RL's defaults).
        thinking_tags: Think tags checked for malformed thinking (NeMo RL's defaults).

    Returns:
        ``{"message_log": [...], "input_message_log": message_log[:1], "full_result": reply}``.
        When the server gave step rewards (the verdict's ``step_rewards``, one per model turn),
        each assistant message also carries its turn's ``step_reward``; ``full_result`` keeps
        ``step_rewards`` and ``step_reward_sum``, and ``reward_components`` when the verifier gave them.

    Raises:
        NemoRLFormatError: An invariant NeMo RL asserts is broken; the message names the turn:
            a prompt that does not start with every token seen so far, a turn that adds no
            prompt tokens, token ids that are not non-negative ints, log-probs that are
            missing, of another length or not finite, no turn with token data, a reward that
            is not a finite number, or ``reward_components`` that do not sum to ``reward``.
    """
    entries_reply = _items_of(source)[1]
    full_result = full_result if full_result is not None else entries_reply
    if full_result is None:
        raise NemoRLFormatError("no /verify reply: pass full_result=..., or an Episode that has been verified")
    reward = _check_reward(full_result)
    patterns = tuple(invalid_tool_call_patterns or INVALID_TOOL_CALL_PATTERNS)
    tags = tuple(thinking_tags or THINKING_TAGS)
    messages: list[dict[str, Any]] = []
    seen: list[int] = []
    turns = token_turns(source)
    step_rewards = _step_rewards(full_result, len(turns))
    for number, turn in enumerate(turns, start=1):
        where = f"turn {number} ({turn.where})" if turn.where else f"turn {number}"
        if turn.generation_token_ids is None or turn.prompt_token_ids is None:
            missing = "generation_token_ids" if turn.generation_token_ids is None else "prompt_token_ids"
            raise NemoRLFormatError(f"{where}: has token data but no {missing}; a policy must return all three "
                                    f"fields ({', '.join(TOKEN_FIELDS)})")
        generation = _token_list(turn.generation_token_ids, "generation_token_ids", where)
        if not generation:
            continue  # as NeMo RL: an empty generation is no turn; its prompt opens the next one
        prompt = _token_list(turn.prompt_token_ids, "prompt_token_ids", where)
        log_probs = _log_probs(turn.generation_log_probs, len(generation), where)
        if prompt[: len(seen)] != seen:
            at = _first_difference(prompt, seen)
            got = prompt[at] if at < len(prompt) else "the end of the prompt"
            raise NemoRLFormatError(
                f"{where}: prompt_token_ids is not a continuation of the {len(seen)} tokens seen so far "
                f"(prompts and generations of earlier turns): first difference at position {at}, expected "
                f"{seen[at] if at < len(seen) else 'more tokens'}, got {got}. The policy re-tokenized or cut "
                "the conversation; each prompt must extend the previous prompt plus its generated tokens")
        new = prompt[len(seen):]
        if not new:
            raise NemoRLFormatError(f"{where}: prompt_token_ids adds no token to the {len(seen)} seen so far; "
                                    "a turn's prompt must contain the environment's reply (or the generation prompt)")
        invalid, malformed = _flags(turn.item, patterns, tags)
        messages.append({"role": "user", "content": "", "token_ids": new})
        messages.append({"role": "assistant", "content": "", "token_ids": generation,
                         "generation_logprobs": log_probs, "is_invalid_tool_call": invalid,
                         "has_malformed_thinking": malformed})
        if step_rewards is not None:
            messages[-1]["step_reward"] = step_rewards[number - 1]
        seen = prompt + generation
    if not messages:
        raise NemoRLFormatError(
            "the episode has no turn with token data (prompt_token_ids, generation_token_ids, generation_log_probs "
            "on a model item); use a policy that returns them: LocalPolicy, or OpenAIPolicy(token_data=True) "
            "against vLLM")
    if tensors:
        messages = _tensorize(messages)
    result_full = _without_token_fields(full_result)
    result_full["reward"] = reward
    if full_result.get("mask_sample") is True:
        # NeMo RL reads the flag where NeMo Gym's mask rules put it: the sample leaves the loss
        # (its reward still counts in the group's baseline), it is not scored 0.
        result_full["instance_config"] = {**(full_result.get("instance_config") or {}), "mask_sample": True}
    return {"message_log": messages, "input_message_log": messages[:1], "full_result": result_full}


def _tensorize(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # torch is optional (lists serve without it) and slow to import: only tensors=True needs it.
    import torch

    out = []
    for message in messages:
        message = dict(message, token_ids=torch.tensor(message["token_ids"], dtype=torch.long))
        if "generation_logprobs" in message:
            message["generation_logprobs"] = torch.tensor(message["generation_logprobs"], dtype=torch.float32)
        out.append(message)
    return out


def check_nemo_rl_result(result: Mapping[str, Any]) -> None:
    """Check a result dict against the layout NeMo RL consumes (lists or tensors).

    Raises:
        NemoRLFormatError: What is wrong, naming the message.
    """
    if not isinstance(result, Mapping):
        raise NemoRLFormatError(f"a result is a dict, got {type(result).__name__}")
    missing = [k for k in ("message_log", "input_message_log", "full_result") if k not in result]
    if missing:
        raise NemoRLFormatError(f"the result has no {', '.join(missing)}")
    log_ = result["message_log"]
    if not isinstance(log_, list) or not log_ or len(log_) % 2:
        raise NemoRLFormatError("message_log must be a non-empty list of user/assistant message pairs")
    for i, message in enumerate(log_):
        role = "user" if i % 2 == 0 else "assistant"
        where = f"message_log[{i}]"
        if not isinstance(message, Mapping) or message.get("role") != role:
            raise NemoRLFormatError(f"{where} must be a {role!r} message (roles alternate, starting with user)")
        if message.get("content") != "":
            raise NemoRLFormatError(f"{where}: content must be '' (NeMo RL trains on token_ids only)")
        tokens = _token_list(message.get("token_ids"), "token_ids", where)
        if not tokens:
            raise NemoRLFormatError(f"{where}: token_ids is empty")
        if role == "assistant":
            _log_probs(message.get("generation_logprobs"), len(tokens), where)
    first = result["input_message_log"]
    if not isinstance(first, list) or len(first) != 1 or first[0] is not log_[0] and (
            _token_list(first[0].get("token_ids"), "token_ids", "input_message_log[0]")
            != _token_list(log_[0]["token_ids"], "token_ids", "message_log[0]")):
        raise NemoRLFormatError("input_message_log must be message_log[:1]")
    if not isinstance(result["full_result"], Mapping):
        raise NemoRLFormatError("full_result must be the /verify reply (a dict)")
    _check_reward(result["full_result"])
