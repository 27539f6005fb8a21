"""Build any policy by its kind's name: what the CLI, the recipes and the NeMo RL adapter call.

Light on purpose: it imports a policy's module only when that kind is built (the OpenAI client
and torch are not imported for a scripted run).

Example:
    >>> make_policy("scripted", server="example_single_tool_call").name
    'scripted:example_single_tool_call'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemo_gym_env.policies.base import Policy

__all__ = ["LOCAL_DTYPES", "POLICY_KINDS", "make_policy"]

POLICY_KINDS = ("scripted", "openai", "local")
"""The ``kind`` names :func:`make_policy` knows."""

LOCAL_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
"""The ``dtype`` values of the local policy (:class:`~nemo_gym_env.policies.local.LocalPolicy`)."""

_CLASSES = {
    "scripted": "nemo_gym_env.policies.scripted:ScriptedPolicy",
    "openai": "nemo_gym_env.policies.openai_compat:OpenAIPolicy",
    "local": "nemo_gym_env.policies.local:LocalPolicy",
}


def make_policy(kind: str, **kwargs: Any) -> Policy:
    """Build a policy by kind.

    Args:
        kind: ``"scripted"`` (:class:`~nemo_gym_env.policies.scripted.ScriptedPolicy`: ``server=``,
            ``correct=``), ``"openai"`` (:class:`~nemo_gym_env.policies.openai_compat.OpenAIPolicy`:
            ``model=``, ``base_url=``, ``api_key=``, ``api=``...; or ``config=`` a loaded config
            holding ``policy_base_url``, ``policy_api_key``, ``policy_model_name``, plus overrides)
            or ``"local"`` (:class:`~nemo_gym_env.policies.local.LocalPolicy`: ``model_path=``,
            ``device=``, ``seed=``...).
        **kwargs: The chosen class's arguments.

    Raises:
        ValueError: An unknown kind.

    Example:
        >>> make_policy("openai", model="m", base_url="http://127.0.0.1:8000/v1", api="chat")
        OpenAIPolicy(model='m', base_url='http://127.0.0.1:8000/v1', api='chat', api_key=None)
    """
    if kind not in _CLASSES:
        raise ValueError(f"unknown policy kind {kind!r}; expected one of {', '.join(POLICY_KINDS)}")
    module, _, name = _CLASSES[kind].partition(":")
    cls = getattr(importlib.import_module(module), name)
    config = kwargs.pop("config", None) if kind == "openai" else None
    return cls.from_config(config, **kwargs) if config is not None else cls(**kwargs)
