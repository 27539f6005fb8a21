"""Policies: what drives an env in examples, rollout collection and recipes.

- :class:`ScriptedPolicy`: deterministic scripted players of the bundled servers (tests, demos).
- :class:`OpenAIPolicy`: any OpenAI-compatible endpoint, Responses or Chat Completions
  (OpenAI, vLLM, ...).
- :class:`LocalPolicy` (the ``local`` extra): a Hugging Face transformers model on CPU or GPU,
  keeping token ids and log-probs per turn; by default the embedded SmolLM2-135M-Instruct.

:func:`make_policy` builds any of them by name; :mod:`~nemo_gym_env.policies.render` turns an
episode into a chat template's text, token-exactly (the TRL adapter uses it too).

Example:
    >>> policy = make_policy("scripted", server="example_single_tool_call")
    >>> policy.name
    'scripted:example_single_tool_call'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.errors import PolicyError
    from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn
    from nemo_gym_env.policies.factory import POLICY_KINDS, make_policy
    from nemo_gym_env.policies.local import LocalPolicy
    from nemo_gym_env.policies.openai_compat import OpenAIPolicy
    from nemo_gym_env.policies.scripted import ScriptedPolicy, scripted_player

__all__ = [
    "POLICY_KINDS",
    "LocalPolicy",
    "OpenAIPolicy",
    "Policy",
    "PolicyError",
    "PolicyRequest",
    "PolicyTurn",
    "ScriptedPolicy",
    "make_policy",
    "scripted_player",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    "PolicyError": "nemo_gym_env.errors",
    **dict.fromkeys(("Policy", "PolicyRequest", "PolicyTurn"), "nemo_gym_env.policies.base"),
    **dict.fromkeys(("POLICY_KINDS", "make_policy"), "nemo_gym_env.policies.factory"),
    "LocalPolicy": "nemo_gym_env.policies.local",
    "OpenAIPolicy": "nemo_gym_env.policies.openai_compat",
    **dict.fromkeys(("ScriptedPolicy", "scripted_player"), "nemo_gym_env.policies.scripted"),
})
