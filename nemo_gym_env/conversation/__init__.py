"""Conversations: servers whose agent has tools and a simulated user who talks back (docs/conversations.md).

- :mod:`~nemo_gym_env.conversation.server`: :class:`ConversationServer`, the base class of a
  conversational resources server (Gymnasium protocol: the user's messages are observations);
- :mod:`~nemo_gym_env.conversation.users`: the user's spec in a task row and who plays it (a
  scripted user, or a model behind any policy of ours).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.conversation.server import ConversationConfig, ConversationServer
    from nemo_gym_env.conversation.users import STOP, PolicyUser, ScriptedUser, Talk, UserDetail, UserSpec
    from nemo_gym_env.errors import ToolError, UserFailure

__all__ = ["STOP", "ConversationConfig", "ConversationServer", "PolicyUser", "ScriptedUser", "Talk", "ToolError",
           "UserDetail", "UserFailure", "UserSpec"]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("ConversationConfig", "ConversationServer"), "nemo_gym_env.conversation.server"),
    **dict.fromkeys(("STOP", "PolicyUser", "ScriptedUser", "Talk", "UserDetail", "UserSpec"),
                    "nemo_gym_env.conversation.users"),
    **dict.fromkeys(("ToolError", "UserFailure"), "nemo_gym_env.errors"),
})
