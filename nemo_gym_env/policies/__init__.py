"""Policies: what drives an env in examples, rollout collection and recipes.

- :class:`ScriptedPolicy`: deterministic scripted players of the bundled servers (tests, demos).
- :class:`OpenAIPolicy`: any OpenAI-compatible endpoint, Responses or Chat Completions
  (OpenAI, vLLM, ...).
- :class:`LocalPolicy` (``nemo_gym_env.policies.local``, the ``local`` extra): a Hugging Face
  transformers model on CPU or GPU, keeping token ids and log-probs per turn; by default the
  embedded SmolLM2-135M-Instruct.

:func:`make_policy` builds any of them by name.

Example:
    >>> policy = make_policy("scripted", server="example_single_tool_call")
    >>> policy.name
    'scripted:example_single_tool_call'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Policy, PolicyRequest, PolicyTurn
from .openai_compat import OpenAIPolicy, PolicyError
from .scripted import ScriptedPolicy, scripted_player

if TYPE_CHECKING:
    from .local import LocalPolicy

__all__ = [
    "Policy",
    "PolicyRequest",
    "PolicyTurn",
    "PolicyError",
    "ScriptedPolicy",
    "OpenAIPolicy",
    "LocalPolicy",
    "make_policy",
    "scripted_player",
]

POLICY_KINDS = ("scripted", "openai", "local")
"""The ``kind`` names :func:`make_policy` knows."""


def __getattr__(name: str) -> Any:
    # LocalPolicy imports torch: only on first use.
    if name == "LocalPolicy":
        from .local import LocalPolicy

        return LocalPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_policy(kind: str, **kwargs: Any) -> Policy:
    """Build a policy by kind.

    Args:
        kind: ``"scripted"`` (:class:`ScriptedPolicy`: ``server=``, ``correct=``),
            ``"openai"`` (:class:`OpenAIPolicy`: ``model=``, ``base_url=``, ``api_key=``,
            ``api=``...; or ``config=`` a loaded config holding ``policy_base_url``,
            ``policy_api_key``, ``policy_model_name``, plus overrides) or ``"local"``
            (:class:`LocalPolicy`: ``model_path=``, ``device=``, ``seed=``...).
        **kwargs: The chosen class's arguments.

    Raises:
        ValueError: An unknown kind.

    Example:
        >>> make_policy("openai", model="m", base_url="http://127.0.0.1:8000/v1", api="chat")
        OpenAIPolicy(model='m', base_url='http://127.0.0.1:8000/v1', api='chat', api_key=None)
    """
    if kind == "scripted":
        return ScriptedPolicy(**kwargs)
    if kind == "openai":
        config = kwargs.pop("config", None)
        return OpenAIPolicy.from_config(config, **kwargs) if config is not None else OpenAIPolicy(**kwargs)
    if kind == "local":
        from .local import LocalPolicy

        return LocalPolicy(**kwargs)
    raise ValueError(f"unknown policy kind {kind!r}; expected one of {', '.join(POLICY_KINDS)}")
