"""Responses-API items as a chat template's text, so that later turns extend earlier ones token for token.

A model's prompt comes from its tokenizer's chat template. When the template takes tools
(``apply_chat_template(..., tools=...)`` renders them), tools go there and tool outputs are
``tool`` messages. Otherwise (SmolLM2's template ignores tools) the tool schemas are written
into the system prompt in Hermes form (``<tools>`` JSON lines and the ``<tool_call>`` reply
format) and tool outputs come back as user turns of ``<tool_response>`` blocks.

:meth:`ChatRenderer.continuation` is what keeps multi-turn prompts token-exact: the text that
follows a finished assistant turn (its closing markup, the new environment messages, the
generation prompt), taken from the template itself, so a caller appends its tokens to the
tokens seen so far instead of re-rendering and re-tokenizing the model's own text.
:class:`~nemo_gym_env.policies.local.LocalPolicy` and the TRL adapter both render this way.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym_env.errors import NoContinuation
from nemo_gym_env.protocol.items import content_text, is_model_item
from nemo_gym_env.protocol.parser import items_to_text

__all__ = ["ChatRenderer", "NoContinuation", "hermes_tools_block", "merge_tool_responses"]

_PLACEHOLDER = "\u2063NGE-ASSISTANT-TURN\u2063"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7c1", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
_TOOL_RESPONSE = "_nge_tool_response"  # marks a rendered tool output until consecutive ones are merged


def hermes_tools_block(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\n"
        "You can call the functions whose signatures are listed, one JSON object per line, "
        f"between <tools></tools>:\n<tools>\n{lines}\n</tools>\n\n"
        "To call one, reply with its name and arguments as a JSON object between <tool_call></tool_call>:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
        "Results come back between <tool_response></tool_response>."
    )


class ChatRenderer:
    """Responses items -> chat-template text for one tokenizer.

    Example (any tokenizer with a chat template)::

        renderer = ChatRenderer(tokenizer)
        text = renderer.render(renderer.messages(obs, [], tools), renderer.template_tools(tools), True)
    """

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; LocalPolicy needs an instruct/chat model")
        self.tokenizer = tokenizer
        probe = [{"role": "user", "content": "x"}]
        try:
            self.native_tools = self.render(probe, [_PROBE_TOOL], False) != self.render(probe, None, False)
        except Exception:  # noqa: BLE001 - a template that chokes on tools= does not take them
            self.native_tools = False

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation_prompt, tokenize=False
        )

    def template_tools(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Tools for ``apply_chat_template``: the chat-shaped list, or None when they go into the system prompt."""
        return tools if (tools and self.native_tools) else None

    def messages(self, input: Any, history: list[dict[str, Any]], tools: list[dict[str, Any]],
                 instructions: str | None = None) -> list[dict[str, Any]]:
        """The whole conversation as template messages (for a first turn, or a foreign history)."""
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        if instructions:
            items.insert(0, {"role": "system", "content": instructions})
        names = {i.get("call_id"): i.get("name") for i in [*items, *history] if i.get("type") == "function_call"}
        messages: list[dict[str, Any]] = []
        for item in items:
            role = item.get("role")
            if item.get("type", "message") != "message" or role not in ("system", "developer", "user", "assistant"):
                messages.append(self._env_message(item, names))
                continue
            messages.append({"role": "system" if role == "developer" else role, "content": content_text(item.get("content"))})
        if tools and not self.native_tools:
            block = hermes_tools_block(tools)
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
            else:
                messages.insert(0, {"role": "system", "content": block})
        run: list[dict[str, Any]] = []
        for item in history:
            if is_model_item(item):
                run.append(item)
                continue
            if run:
                messages.append({"role": "assistant", "content": items_to_text(run)})
                run = []
            messages.append(self._env_message(item, names))
        if run:
            messages.append({"role": "assistant", "content": items_to_text(run)})
        return merge_tool_responses(messages)

    def env_messages(self, items: list[dict[str, Any]], *, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Template messages for environment items (tool outputs, user messages)."""
        names = {i.get("call_id"): i.get("name") for i in history if i.get("type") == "function_call"}
        return merge_tool_responses([self._env_message(item, names) for item in items])

    def _env_message(self, item: dict[str, Any], names: dict[Any, Any]) -> dict[str, Any]:
        kind = item.get("type", "message")
        if kind == "function_call_output":
            output = item.get("output")
            output = output if isinstance(output, str) else content_text(output)
            if not self.native_tools:
                return {"role": "user", "content": f"<tool_response>\n{output}\n</tool_response>", _TOOL_RESPONSE: True}
            message = {"role": "tool", "content": output, "tool_call_id": item.get("call_id")}
            if names.get(item.get("call_id")):
                message["name"] = names[item.get("call_id")]
            return message
        if kind == "message" and item.get("role") in ("user", "system", "developer"):
            return {"role": "user" if item["role"] == "user" else "system", "content": content_text(item.get("content"))}
        raise ValueError(f"LocalPolicy cannot render an environment item of type {kind!r}")

    def continuation(self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                     generated_end: str | None) -> str:
        """Text that follows a finished assistant turn: its closing markup, ``new_messages``, the generation prompt.

        ``generated_end`` is the text of the generation's last token when it was an end-of-turn
        token (already in the prompt, so not repeated), else None.
        """
        base = [{"role": "user", "content": "."}, {"role": "assistant", "content": _PLACEHOLDER}]
        try:
            before = self.render(base, tools, False)
            after = self.render(base + new_messages, tools, True)
        except Exception as exc:  # noqa: BLE001 - any template error means: render the whole conversation
            raise NoContinuation(f"the chat template failed on a continuation ({exc})") from None
        at = before.find(_PLACEHOLDER)
        if at < 0 or not after.startswith(before):
            raise NoContinuation("the chat template re-renders earlier turns when new messages follow")
        closing = before[at + len(_PLACEHOLDER):]
        if generated_end and closing.startswith(generated_end):
            closing = closing[len(generated_end):]
        return closing + after[len(before):]


def merge_tool_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive ``<tool_response>`` user turns become one user turn, one block per line."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        if message.get(_TOOL_RESPONSE) and merged and merged[-1].get(_TOOL_RESPONSE):
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n" + message["content"]}
        else:
            merged.append(message)
    return [{k: v for k, v in m.items() if k != _TOOL_RESPONSE} for m in merged]
