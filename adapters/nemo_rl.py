"""NeMo RL adapter: our environments as NeMo RL's ``task_to_env["nemo_gym"]``.

NeMo RL's GRPO drives NeMo Gym through a Ray actor (``nemo_rl.environments.nemo_gym.NemoGym``)
whose ``run_rollouts(rows, timer_prefix, ...)`` is an async generator of
``(row["_rowidx"], result, timing)``; GRPO reads ``result["message_log"]``,
``result["input_message_log"]`` and ``result["full_result"]["reward"]``. This module gives the
same contract over our Env/Episode and policies:

- :func:`to_nemo_rl_result`: one finished episode (its items carrying ``prompt_token_ids``,
  ``generation_token_ids``, ``generation_log_probs``) -> NeMo RL's result dict, with every
  invariant NeMo RL asserts checked up front and reported by turn.
- :class:`NemoGymRollouts`: the rollout producer (``run_rollouts`` streams results as episodes
  finish); :func:`actor_class` is the same class as a ``@ray.remote`` actor, built on first use
  so importing this module never needs ray.
- :func:`register_with_nemo_rl`: makes NeMo RL's GRPO and distillation set-up create our actor
  instead of NeMo Gym's.

Example (no NeMo RL needed)::

    from nemo_gym_env.adapters.nemo_rl import to_nemo_rl_result
    env.reset(seed=0); ...                          # play with a policy returning token data
    result = to_nemo_rl_result(env.unwrapped.episode)
    [m["role"] for m in result["message_log"]]      # ['user', 'assistant', 'user', 'assistant']

The layout, as NeMo RL builds it (``_postprocess_nemo_gym_to_nemo_rl_result``): one
``{"role": "user", "content": "", "token_ids": new prompt tokens}`` and one
``{"role": "assistant", "content": "", "token_ids": generated tokens, "generation_logprobs":
[...]}`` per model call, the user message holding only the prompt tokens not seen before;
``input_message_log`` is ``message_log[:1]``; ``full_result`` is the ``/verify`` reply with the
token fields taken off its items. A model call whose generation is empty is skipped, as NeMo RL
skips it (its prompt tokens then open the next user message).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.util
import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.policies.base import Policy
from nemo_gym_env.protocol.keys import FAILURE_CLASS_KEY, TASK_INDEX_KEY
from nemo_gym_env.rollouts.jobs import RolloutJob, run_rollout
from nemo_gym_env.rollouts.output import is_failure
from nemo_gym_env.rollouts.plan import route_row

__all__ = [
    "TOKEN_FIELDS",
    "NemoGymRollouts",
    "NemoRLFormatError",
    "RolloutFailed",
    "TokenTurn",
    "actor_class",
    "check_nemo_rl_result",
    "register_with_nemo_rl",
    "spinup_actor",
    "to_nemo_rl_result",
    "token_turns",
]

log = logging.getLogger(__name__)

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
"""The per-call training fields on the last output item of each model call (docs/architecture.md, "The wire")."""

ROW_INDEX_KEY = "_rowidx"
"""NeMo RL's stable row index, set on every row it sends to ``run_rollouts``."""

INVALID_TOOL_CALL_PATTERNS = ("<tool_call>", "</tool_call>", "<function_call>", "</function_call>")
THINKING_TAGS = ("<think>", "</think>")


class NemoRLFormatError(ValueError):
    """An episode NeMo RL would reject; the message names the turn and the fix."""


class RolloutFailed(RuntimeError):
    """A row whose rollout failed on every attempt (its policy or server kept failing)."""


# ---- episode -> result -------------------------------------------------------------------------


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


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True)
    return value


def _items_of(source: Any) -> tuple[list[Any], Mapping[str, Any] | None]:
    """``(items or turns, verify reply if the source has one)`` of any accepted source."""
    if hasattr(source, "unwrapped") and getattr(source.unwrapped, "episode", None) is not None:  # an env
        source = source.unwrapped.episode
    if hasattr(source, "trajectory") and hasattr(source, "last_verify"):  # an Episode
        return list(source.trajectory), source.last_verify
    source = _plain(source)
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
            a list of Responses items, or a list of turns (:class:`PolicyTurn` objects or dicts
            with the three token fields).

    Items without any token field (tool outputs, the earlier items of a call) are not turns.
    """
    entries, _ = _items_of(source)
    turns = []
    for position, raw in enumerate(entries):
        if hasattr(raw, "generation_token_ids") and hasattr(raw, "items"):  # a PolicyTurn
            items = list(raw.items or [])
            turns.append(TokenTurn(raw.prompt_token_ids, raw.generation_token_ids, raw.generation_log_probs,
                                   _plain(items[-1]) if items else None, f"turn entry {position}"))
            continue
        entry = _plain(raw)
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


def _without_token_fields(full_result: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the verify reply whose output items no longer carry the (now duplicated) token fields."""
    out = dict(full_result)
    response = out.get("response")
    if isinstance(response, Mapping) and isinstance(response.get("output"), list):
        output = [{k: v for k, v in item.items() if k not in TOKEN_FIELDS} if isinstance(item, Mapping) else item
                  for item in response["output"]]
        out["response"] = {**response, "output": output}
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
    for number, turn in enumerate(token_turns(source), start=1):
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
    return {"message_log": messages, "input_message_log": messages[:1], "full_result": result_full}


def _tensorize(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


# ---- the rollout producer ----------------------------------------------------------------------


PolicySource = Policy | Callable[[], Policy] | Mapping[str, Any]
"""A policy, a zero-argument factory of one, or ``{"kind": ..., **make_policy kwargs}``."""


def _build_policy(source: PolicySource) -> Policy:
    from nemo_gym_env.policies import make_policy

    if isinstance(source, Policy):
        return source
    if isinstance(source, Mapping):
        spec = dict(source)
        return make_policy(spec.pop("kind", "openai"), **spec)
    if callable(source):
        policy = source()
        if not isinstance(policy, Policy):
            raise TypeError(f"the policy factory returned a {type(policy).__name__}, not a Policy")
        return policy
    raise TypeError(f"policy must be a Policy, a factory of one or a make_policy spec dict, got {type(source).__name__}")


class _PinnedPrefix(Policy):
    """An OpenAI-compatible chat policy whose every call pins the conversation to the tokens seen so far.

    NeMo RL's vLLM server re-renders the chat history with the template, then replaces the
    rendering's prefix with ``required_prefix_token_ids`` (NeMo Gym's on-policy correction), so
    each prompt extends the previous prompt plus its generation even where re-tokenizing the
    model's text would differ (tool-call formatting, stripped reasoning). Other servers ignore
    the field.
    """

    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = inner.name

    async def generate(self, request: Any) -> Any:
        last = next((item for item in reversed(request.history)
                     if isinstance(item, Mapping) and item.get("generation_token_ids")), None)
        if last is None or not hasattr(self.inner, "extra_body"):
            return await self.inner.generate(request)
        call = copy.copy(self.inner)  # shares the client pool; only this call's body differs
        call.extra_body = {**self.inner.extra_body,
                           "required_prefix_token_ids": list(last["prompt_token_ids"]) + list(last["generation_token_ids"])}
        return await call.generate(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class _Settings:
    """What ``env.nemo_gym`` (NeMo RL's ``initial_global_config_dict``) may set for our actor."""

    servers: tuple[str, ...] = ()
    config_paths: tuple[str, ...] = ()
    server_urls: dict[str, str] | None = None
    head_url: str | None = None
    placement: str = "local"
    server_host: str | None = None
    policy: dict[str, Any] | None = None
    concurrency: int = 256
    max_steps: int = 16
    max_attempts: int = 2
    request_timeout_s: float = 300.0
    turn_timeout_s: float | None = None
    tensors: bool | None = None
    ray_head_node_address: str | None = None

    @classmethod
    def from_block(cls, block: Mapping[str, Any]) -> _Settings:
        known = set(cls.__dataclass_fields__)
        values = {k: block[k] for k in known if block.get(k) is not None}
        for key in ("servers", "config_paths"):
            if key in values:
                value = values[key]
                values[key] = (value,) if isinstance(value, str) else tuple(str(v) for v in value)
        settings = cls(**values)
        if settings.placement not in ("local", "ray"):
            raise ValueError(f"env.nemo_gym.placement must be 'local' or 'ray', got {settings.placement!r}")
        if settings.concurrency < 1 or settings.max_steps < 1 or settings.max_attempts < 1:
            raise ValueError("env.nemo_gym.concurrency, max_steps and max_attempts must be >= 1")
        return settings


class NemoGymRollouts:
    """The rollout producer NeMo RL's GRPO drives, over our resources servers and policies.

    Same surface as ``nemo_rl.environments.nemo_gym.NemoGym``: construct with NeMo RL's
    ``NemoGymConfig`` (``model_name``, ``base_urls``, ``initial_global_config_dict`` = the
    ``env.nemo_gym`` block), then ``_spinup()``, ``set_tokenizer(...)``, ``run_rollouts(...)``,
    ``health_check()``, ``shutdown()``. ``run_rollouts`` spins up by itself when needed, so an
    actor that Ray restarted works again.

    The ``env.nemo_gym`` block (all optional): ``servers`` (bundled server names to launch),
    ``config_paths`` (our/NeMo Gym server YAMLs to launch), ``server_urls`` (``{name: url}`` of
    running servers) or ``head_url``; ``placement`` (``local``: server processes next to the
    actor, on loopback; ``ray``: servers spread over the cluster as Ray actors, on their
    nodes' addresses or ``server_host``); ``policy`` (overrides of
    the default policy, an OpenAI-compatible chat client with token data against ``base_urls``
    and ``model_name`` that sends NeMo RL's ``required_prefix_token_ids`` with each call
    (``pin_prefix: false`` turns that off); ``kind: local`` for a LocalPolicy); ``concurrency`` (episodes in
    flight), ``max_steps``, ``max_attempts`` (a failed rollout is retried before the batch
    fails), ``request_timeout_s``, ``turn_timeout_s``, ``tensors`` (token data as torch
    tensors, default when torch is importable). Instance blocks in it
    (``math: {resources_servers: {math: {...}}}``) override the launched servers' configs.
    NeMo RL's own keys (``port_range_low``...) are ignored.

    Args:
        cfg: NeMo RL's ``NemoGymConfig`` (a dict), or None.
        policy: Overrides the policy (a :class:`Policy`, a factory, or a ``make_policy`` spec).
        servers: ``{name: url}`` of running servers; overrides the config.

    Rows: each row is a NeMo Gym dataset row plus NeMo RL's ``_rowidx``; ``agent_ref.name``
    names the server (or an agent whose ``resources_server`` names it); with one server it
    may be omitted.

    Example::

        producer = NemoGymRollouts(servers={"math": url}, policy=LocalPolicy(temperature=1.0))
        async for row_index, result, timing in producer.run_rollouts(rows, "timing/rollout"):
            ...
    """

    def __init__(self, cfg: Mapping[str, Any] | None = None, *, policy: PolicySource | None = None,
                 servers: Mapping[str, str] | None = None):
        cfg = dict(cfg or {})
        block = dict(cfg.get("initial_global_config_dict") or {})
        self.cfg = cfg
        self.settings = _Settings.from_block(block)
        self._block = block
        self._policy_source = policy
        self._server_override = dict(servers) if servers else None
        self.servers: dict[str, str] = {}
        self._routes: dict[str, str] = {}
        self._policies: list[Policy] = []
        self._launcher: Any = None
        self._clients: dict[str, ResourcesClient] = {}
        self.tokenizer: Any = None
        self._ready = False

    # ---- NeMo RL's actor surface -----------------------------------------------------------

    def _spinup(self) -> None:
        """Launch or find the servers and build the policies (idempotent)."""
        if self._ready:
            return
        self.servers = self._find_servers()
        if not self.servers:
            raise ValueError("no resources server: set env.nemo_gym.servers, config_paths, server_urls or head_url")
        self._policies = self._make_policies()
        if self._tensors():
            importlib.import_module("torch")  # now, not inside the first batch's timing
        self._ready = True
        log.info("nemo_gym_env rollouts ready: servers %s, policy %s", self.servers,
                 ", ".join(p.name for p in self._policies))

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Keep NeMo RL's tokenizer (our policies bring their own token ids; kept for parity)."""
        self.tokenizer = tokenizer

    def health_check(self) -> None:
        """Raise if a resources server does not answer ``GET /``."""
        import httpx

        self._spinup()
        for name, url in self.servers.items():
            try:
                ok = httpx.get(url + "/", timeout=10.0, trust_env=False).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                raise RuntimeError(f"resources server {name!r} at {url} does not answer GET /")

    def shutdown(self) -> None:
        """Stop the servers this producer launched; safe to call twice."""
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None
        self._ready = False

    async def run_rollouts(self, rows: Sequence[dict[str, Any]], timer_prefix: str = "timing/rollout",
                           deduplicate_multimodal_data: bool = False,
                           *_: Any, **__: Any) -> AsyncIterator[tuple[int, dict[str, Any], dict[str, float]]]:
        """Play every row, concurrently; yield ``(row["_rowidx"], result, timing)`` as episodes finish.

        ``timing`` holds cumulative ``<timer_prefix>/await_results`` (seconds spent waiting for
        episodes), ``/postprocess_results`` and ``/postprocess_results_pct``: the last one
        yielded covers the whole batch. A row whose rollout fails ``max_attempts`` times raises
        :class:`RolloutFailed`, and an episode NeMo RL would reject raises
        :class:`NemoRLFormatError`, both naming the row; the rollouts still in flight are
        cancelled. ``deduplicate_multimodal_data`` is accepted for NeMo RL's signature (text only here).

        Raises:
            ValueError: An empty batch, or a row that names no known server.
        """
        if not rows:
            raise ValueError("the rollout batch must not be empty")
        self._spinup()
        jobs = [self._job(position, row) for position, row in enumerate(rows)]
        slots = asyncio.Semaphore(self.settings.concurrency)
        tensors = self._tensors()
        waited = postprocessed = 0.0
        started = time.perf_counter()

        async def play(job: RolloutJob) -> dict[str, Any]:
            async with slots:
                return await self._play(job)

        tasks = {asyncio.ensure_future(play(job)): row_index for row_index, job in jobs}
        try:
            pending = set(tasks)
            while pending:
                mark = time.perf_counter()
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                waited += time.perf_counter() - mark
                for task in done:
                    mark = time.perf_counter()
                    row_index = tasks[task]
                    result = self._result(row_index, task.result(), tensors)
                    postprocessed += time.perf_counter() - mark
                    total = max(time.perf_counter() - started, 1e-9)
                    timing = {f"{timer_prefix}/await_results": waited,
                              f"{timer_prefix}/postprocess_results": postprocessed,
                              f"{timer_prefix}/postprocess_results_pct": 100 * postprocessed / total}
                    yield row_index, result, timing
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- internals -------------------------------------------------------------------------

    def _job(self, position: int, row: dict[str, Any]) -> tuple[int, RolloutJob]:
        row_index = row.get(ROW_INDEX_KEY, position)
        if isinstance(row_index, bool) or not isinstance(row_index, int):
            raise TypeError(f"row {position}: {ROW_INDEX_KEY} must be an int, got {row_index!r}")
        name = self._server_of(row, row_index)
        task_index = row.get(TASK_INDEX_KEY, row_index)
        policy = self._policies[row_index % len(self._policies)]  # one base URL per episode: prefix caching
        return row_index, RolloutJob(row, int(task_index), 0, self._client(name), policy, name)

    def _server_of(self, row: Mapping[str, Any], row_index: int) -> str:
        try:
            return route_row(row, self.servers, self._routes)
        except ValueError as exc:
            raise ValueError(f"row {row_index}: {exc}; set agent_ref.name to a server (or an agent whose "
                             "resources_server names one)") from None

    def _client(self, name: str) -> ResourcesClient:
        client = self._clients.get(name)
        if client is None:
            timeout = self.settings.request_timeout_s
            client = self._clients[name] = ResourcesClient(self.servers[name], timeout_s=timeout,
                                                          verify_timeout_s=timeout)
        return client

    async def _play(self, job: RolloutJob) -> dict[str, Any]:
        reasons = []
        for _ in range(self.settings.max_attempts):
            row = await run_rollout(job, max_steps=self.settings.max_steps, turn_timeout_s=self.settings.turn_timeout_s)
            if not is_failure(row):
                return row
            reasons.append(f"{row.get(FAILURE_CLASS_KEY)}: {row.get('failure_reason')}")
        raise RolloutFailed(f"row {job.row.get(ROW_INDEX_KEY, job.task_index)} (server {job.server!r}) failed "
                            f"{len(reasons)} time(s); last: {reasons[-1][:1500]}")

    def _result(self, row_index: int, row: dict[str, Any], tensors: bool) -> dict[str, Any]:
        try:
            return to_nemo_rl_result(row, tensors=tensors,
                                     invalid_tool_call_patterns=self.cfg.get("invalid_tool_call_patterns"),
                                     thinking_tags=self.cfg.get("thinking_tags"))
        except NemoRLFormatError as exc:
            raise NemoRLFormatError(f"row {row_index} (task {row.get(TASK_INDEX_KEY)}): {exc}") from None

    def _tensors(self) -> bool:
        if self.settings.tensors is not None:
            return bool(self.settings.tensors)
        return importlib.util.find_spec("torch") is not None

    def _make_policies(self) -> list[Policy]:
        if self._policy_source is not None:
            return [_build_policy(self._policy_source)]
        spec = dict(self.settings.policy or {})
        kind = spec.pop("kind", "openai")
        if kind != "openai":
            return [_build_policy({"kind": kind, **spec})]
        urls = spec.pop("base_url", None) or self.cfg.get("base_urls") or []
        urls = [urls] if isinstance(urls, str) else list(urls)
        model = spec.pop("model", None) or self.cfg.get("model_name")
        if not urls or not model:
            raise ValueError("no policy: NeMo RL passes base_urls and model_name; otherwise set env.nemo_gym.policy "
                             "(kind, model, base_url...) or pass policy=...")
        pin = bool(spec.pop("pin_prefix", True))
        # NeMo RL's vLLM server returns token data only with logprobs and top_logprobs set.
        defaults = {"api": "chat", "token_data": True, "api_key": "EMPTY", "max_retries": 3,
                    "extra_body": {"top_logprobs": 0, **dict(spec.pop("extra_body", None) or {})}}
        policies = [_build_policy({"kind": "openai", "model": model, "base_url": url, **defaults, **spec})
                    for url in urls]
        return [_PinnedPrefix(p) for p in policies] if pin else policies

    def _find_servers(self) -> dict[str, str]:
        from nemo_gym_env.client.head import fetch_servers

        settings = self.settings
        if self._server_override:
            return {k: v.rstrip("/") for k, v in self._server_override.items()}
        found = {k: str(v).rstrip("/") for k, v in (settings.server_urls or {}).items()}
        if settings.head_url:
            found.update(fetch_servers(settings.head_url))
        specs = self._specs()
        if specs:
            found.update(self._launch(specs))
        return found

    def _specs(self) -> list[Any]:
        from nemo_gym_env.launch.catalog import bundled_spec
        from nemo_gym_env.launch.config import ServerSpec, load_config, server_specs

        specs = [bundled_spec(name) for name in self.settings.servers]
        if self.settings.config_paths:
            cfg = load_config(list(self.settings.config_paths), env_yaml=None)
            specs += server_specs(cfg)
            self._routes = _agent_routes(cfg)
        address = self.settings.ray_head_node_address or self._ray_address()
        out = []
        for spec in specs:
            override = (((self._block.get(spec.instance_name) or {}).get(spec.server_type) or {})
                        .get(spec.impl_name) or {})
            config = {**spec.config, **dict(override)}
            if address:
                config.setdefault("ray_head_node_address", address)  # NeMo Gym's global key, per server here
            out.append(ServerSpec(spec.instance_name, spec.server_type, spec.impl_name, config, spec.config_dir))
        return out

    def _ray_address(self) -> str | None:
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return None
        return ray.get_runtime_context().gcs_address

    def _launch(self, specs: list[Any]) -> dict[str, str]:
        if self.settings.placement == "ray":
            from nemo_gym_env.ray_cluster import RayLauncher

            self._launcher = RayLauncher(host=self.settings.server_host)
        else:
            from nemo_gym_env.launch.launcher import Launcher

            self._launcher = Launcher(auto_restart=True)
        return {proc.name: proc.url for proc in self._launcher.start_all(specs)}


def _agent_routes(cfg: Any) -> dict[str, str]:
    """NeMo Gym agent instance -> the resources server it names (``resources_server: {name}``)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    routes = {}
    for name, block in raw.items():
        agents = block.get("responses_api_agents") if isinstance(block, dict) else None
        for impl in agents.values() if isinstance(agents, dict) else ():
            ref = impl.get("resources_server") if isinstance(impl, dict) else None
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                routes[str(name)] = ref["name"]
    return routes


# ---- Ray and NeMo RL ---------------------------------------------------------------------------


_ACTOR_CLASS: Any = None


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ImportError("the NeMo RL actor needs ray: pip install 'nemo-gym-env[ray]'") from None


def actor_class() -> Any:
    """:class:`NemoGymRollouts` as a Ray actor class (built on first call; needs ``ray``).

    Restarted by Ray if its process dies (``max_restarts=-1``); a call in flight then fails
    rather than being replayed, so a streamed batch is never duplicated.
    """
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        ray = _import_ray()
        _ACTOR_CLASS = ray.remote(max_restarts=-1, max_task_retries=0)(NemoGymRollouts)
    return _ACTOR_CLASS


def __getattr__(name: str) -> Any:
    if name == "NemoGymActor":
        return actor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spinup_actor(env_configs: Mapping[str, Any], base_urls: Sequence[str], model_name: str, *,
                 tokenizer: Any = None, policy: PolicySource | None = None, **_: Any) -> Any:
    """Create, spin up and return our actor: a stand-in for NeMo RL's ``spinup_nemo_gym_actor``.

    Args:
        env_configs: NeMo RL's ``master_config.env``; ``env_configs["nemo_gym"]`` is our block.
        base_urls: The generation servers' OpenAI-compatible URLs (one per data-parallel rank).
        model_name: The served model name.
        tokenizer: Handed to ``set_tokenizer``.
        policy: Overrides the policy (picklable: it travels to the actor).
        **_: NeMo RL's other arguments (router replay, fastokens), not used here.
    """
    ray = _import_ray()
    block = dict(env_configs.get("nemo_gym") or {})
    cfg = {
        "model_name": model_name,
        "base_urls": list(base_urls),
        "invalid_tool_call_patterns": block.pop("invalid_tool_call_patterns", None),
        "thinking_tags": block.pop("thinking_tags", None),
        "initial_global_config_dict": block,
    }
    actor = actor_class().options(num_cpus=0).remote(cfg, policy=policy)
    ray.get(actor._spinup.remote())
    if tokenizer is not None:
        ray.get(actor.set_tokenizer.remote(tokenizer))
    return actor


_NEMO_RL_HOMES = ("nemo_rl.environments.nemo_gym", "nemo_rl.algorithms.grpo", "nemo_rl.algorithms.distillation",
                  "nemo_rl.algorithms.single_controller_utils.setup")


def register_with_nemo_rl(policy: PolicySource | None = None) -> Callable[..., Any]:
    """Make NeMo RL create our actor wherever it would create NeMo Gym's; call before ``setup()``.

    Replaces ``spinup_nemo_gym_actor`` (and the ``NemoGym`` class name the distillation set-up
    uses) in the NeMo RL modules that import them, and runs the actor in this Python (NeMo Gym's
    actor gets a venv of its own). Idempotent.

    Args:
        policy: Overrides the default policy (see :class:`NemoGymRollouts`).

    Returns:
        The installed spin-up function.

    Raises:
        ImportError: ``nemo_rl`` is not importable; the message says how to get it.
    """
    try:
        importlib.import_module("nemo_rl.environments.nemo_gym")
    except ImportError as exc:
        raise ImportError(
            f"register_with_nemo_rl needs NeMo RL ({exc}). The nemo-rl package on PyPI is an empty placeholder: "
            "install NeMo RL from source (git clone https://github.com/NVIDIA-NeMo/RL && cd RL && uv sync "
            "--extra vllm), then `uv pip install 'nemo-gym-env[ray]'` into that environment and run "
            "recipes/nemo_rl/run_grpo.py there. Without NeMo RL, use NemoGymRollouts or actor_class() directly."
        ) from exc

    def spinup(env_configs: Mapping[str, Any], base_urls: Sequence[str], model_name: str, **kwargs: Any) -> Any:
        return spinup_actor(env_configs, base_urls, model_name, policy=policy, **kwargs)

    spinup._nemo_gym_env = True  # type: ignore[attr-defined]
    actor = actor_class()
    for home in _NEMO_RL_HOMES:
        try:
            module = importlib.import_module(home)
        except ImportError:  # an older or newer NeMo RL without this module
            continue
        if hasattr(module, "spinup_nemo_gym_actor"):
            module.spinup_nemo_gym_actor = spinup
        if hasattr(module, "NemoGym"):
            module.NemoGym = actor
    try:
        registry = importlib.import_module("nemo_rl.distributed.ray_actor_environment_registry")
        registry.ACTOR_ENVIRONMENT_REGISTRY["nemo_rl.environments.nemo_gym.NemoGym"] = sys.executable
    except (ImportError, AttributeError):
        pass
    return spinup
