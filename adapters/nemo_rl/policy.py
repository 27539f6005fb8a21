"""The policy that plays NeMo RL's model: its generation servers, with every prompt pinned to the tokens seen so far.

By default the rollout producer plays an OpenAI-compatible chat client per NeMo RL generation
server (``base_urls``, ``model_name``), asking for token data, wrapped in :class:`PinnedPrefix`;
``env.nemo_gym.policy`` overrides it (another ``kind``, other arguments), and a caller may pass
any policy, a factory of one, or a :func:`~nemo_gym_env.policies.factory.make_policy` spec.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn
from nemo_gym_env.policies.factory import make_policy

__all__ = ["PinnedPrefix", "PolicySource", "build_policy", "default_policies"]

PolicySource = Policy | Callable[[], Policy] | Mapping[str, Any]
"""A policy, a zero-argument factory of one, or ``{"kind": ..., **make_policy kwargs}``."""


def build_policy(source: PolicySource) -> Policy:
    """The policy a :data:`PolicySource` stands for.

    Raises:
        TypeError: ``source`` is none of the three, or the factory returned something else.
    """
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


class PinnedPrefix(Policy):
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

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
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


def default_policies(spec: Mapping[str, Any] | None, base_urls: str | Sequence[str] | None,
                     model_name: str | None) -> list[Policy]:
    """The policies of ``env.nemo_gym.policy`` (``spec``) against NeMo RL's generation servers.

    ``kind: openai`` (the default): one chat client with token data per base URL (``spec``'s
    ``base_url``, else NeMo RL's ``base_urls``), serving ``spec``'s ``model`` or NeMo RL's
    ``model_name``, each wrapped in :class:`PinnedPrefix` unless ``pin_prefix: false``. Any other
    kind: one policy of that kind built from ``spec``.

    Raises:
        ValueError: An OpenAI-compatible policy without a URL or a model.
    """
    spec = dict(spec or {})
    kind = spec.pop("kind", "openai")
    if kind != "openai":
        return [build_policy({"kind": kind, **spec})]
    urls = spec.pop("base_url", None) or base_urls or []
    urls = [urls] if isinstance(urls, str) else list(urls)
    model = spec.pop("model", None) or model_name
    if not urls or not model:
        raise ValueError("no policy: NeMo RL passes base_urls and model_name; otherwise set env.nemo_gym.policy "
                         "(kind, model, base_url...) or pass policy=...")
    pin = bool(spec.pop("pin_prefix", True))
    # NeMo RL's vLLM server returns token data only with logprobs and top_logprobs set.
    defaults = {"api": "chat", "token_data": True, "api_key": "EMPTY", "max_retries": 3,
                "extra_body": {"top_logprobs": 0, **dict(spec.pop("extra_body", None) or {})}}
    policies = [build_policy({"kind": "openai", "model": model, "base_url": url, **defaults, **spec})
                for url in urls]
    return [PinnedPrefix(p) for p in policies] if pin else policies
