"""``LocalPolicy``: a Hugging Face transformers model in this process, keeping token data per turn.

Prompts come from the tokenizer's chat template. When the template takes tools
(``apply_chat_template(..., tools=...)`` renders them), tools go there and tool outputs are
``tool`` messages. Otherwise (SmolLM2's template ignores tools) the tool schemas are written
into the system prompt in Hermes form (``<tools>`` JSON lines and the ``<tool_call>`` reply
format) and tool outputs come back as user turns of ``<tool_response>`` blocks. The model's
text is parsed by :func:`~nemo_gym_env.parser.parse_model_text`.

Token invariant (DESIGN §3): the model's own tokens are never re-tokenized. Turn k's prompt is
turn k-1's prompt, plus its generated tokens, plus the tokenized rendering of only the new
environment messages. That rendering comes from the chat template itself: render a stand-in
assistant turn, render it again followed by the new messages with the generation prompt, and
keep the difference (minus the end-of-turn token the model already produced). The previous
tokens are found on the history's last model item (the fields :meth:`PolicyTurn.action`
attaches) or, when the caller passed bare items, in a cache of this policy's recent turns;
a history this policy did not produce is rendered whole.

Log-probs: ``generation_log_probs[i]`` is the log-probability of token i under the
distribution it was actually sampled from: the log-softmax of the processed scores
(``output_scores``), i.e. logits divided by the temperature and cut by top-p. With
temperature 0 (greedy) it is the log-softmax of the raw logits.

Prompt building and generation run in a worker thread (``asyncio.to_thread``), one turn at a
time per policy, so the event loop stays free while concurrent episodes wait their turn. Each
turn prefills its whole prompt (no key/value cache is kept between turns). With ``seed`` set,
call n of the policy samples with seed ``seed + n``: two policies with the same seed given the
same requests in the same order produce the same tokens.

Example (the first use downloads 93 MB and writes about 640 MB to the cache)::

    policy = LocalPolicy(max_new_tokens=64, temperature=0.7, seed=0)
    turn = await policy.generate(PolicyRequest(input=obs, history=[], tools=info["tools"]))
    env.step(turn.action())
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from ..parser import items_to_text, parse_model_text
from .base import Policy, PolicyRequest, PolicyTurn
from .chat import content_text, tools_to_chat
from .models import DEFAULT_MODEL_NAME, default_model_dir

__all__ = ["LocalPolicy"]

log = logging.getLogger(__name__)

_PLACEHOLDER = "\u2063NGE-ASSISTANT-TURN\u2063"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7c1", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}
_RECENT_TURNS = 4096
_TOOL_RESPONSE = "_nge_tool_response"  # marks a rendered tool output until consecutive ones are merged


def _hermes_tools_block(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\n"
        "You can call the functions whose signatures are listed, one JSON object per line, "
        f"between <tools></tools>:\n<tools>\n{lines}\n</tools>\n\n"
        "To call one, reply with its name and arguments as a JSON object between <tool_call></tool_call>:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
        "Results come back between <tool_response></tool_response>."
    )


class _NoContinuation(Exception):
    """The chat template cannot render new messages as a suffix of earlier ones."""


class _Renderer:
    """Responses items -> chat-template text for one tokenizer."""

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
            block = _hermes_tools_block(tools)
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
            else:
                messages.insert(0, {"role": "system", "content": block})
        run: list[dict[str, Any]] = []
        for item in history:
            if _is_model_item(item):
                run.append(item)
                continue
            if run:
                messages.append({"role": "assistant", "content": items_to_text(run)})
                run = []
            messages.append(self._env_message(item, names))
        if run:
            messages.append({"role": "assistant", "content": items_to_text(run)})
        return _merge_tool_responses(messages)

    def env_messages(self, items: list[dict[str, Any]], *, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Template messages for environment items (tool outputs, user messages)."""
        names = {i.get("call_id"): i.get("name") for i in history if i.get("type") == "function_call"}
        return _merge_tool_responses([self._env_message(item, names) for item in items])

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
            raise _NoContinuation(f"the chat template failed on a continuation ({exc})") from None
        at = before.find(_PLACEHOLDER)
        if at < 0 or not after.startswith(before):
            raise _NoContinuation("the chat template re-renders earlier turns when new messages follow")
        closing = before[at + len(_PLACEHOLDER):]
        if generated_end and closing.startswith(generated_end):
            closing = closing[len(generated_end):]
        return closing + after[len(before):]


def _merge_tool_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive ``<tool_response>`` user turns become one user turn, one block per line."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        if message.get(_TOOL_RESPONSE) and merged and merged[-1].get(_TOOL_RESPONSE):
            merged[-1] = {**merged[-1], "content": merged[-1]["content"] + "\n" + message["content"]}
        else:
            merged.append(message)
    return [{k: v for k, v in m.items() if k != _TOOL_RESPONSE} for m in merged]


def _is_model_item(item: dict[str, Any]) -> bool:
    kind = item.get("type", "message")
    return kind in ("function_call", "reasoning") or (kind == "message" and item.get("role") == "assistant")


class LocalPolicy(Policy):
    """A transformers causal LM run in this process, with token ids and log-probs on every turn.

    Args:
        model_path: None for the embedded default (SmolLM2-135M-Instruct, provisioned into the
            cache on first use, see :mod:`nemo_gym_env.policies.models`), a transformers folder,
            a ``.gguf`` file, or a hub id (which transformers downloads).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        max_new_tokens: Generation budget per turn; None takes the task's ``max_output_tokens``,
            else 512.
        temperature: Sampling temperature (0 is greedy); None takes the task's, else 1.0.
        top_p: Nucleus sampling; None takes the task's, else 1.0.
        seed: Makes sampling reproducible (see the module docstring); None uses torch's global
            generator.
        dtype: Weights' dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).

    Attributes:
        load_seconds: How long loading the tokenizer and model took (provisioning included).

    Example (loads the model, so not run as a doctest)::

        policy = LocalPolicy(temperature=0, max_new_tokens=32)
        turn = background_loop().run(policy.generate(request))
        turn.generation_token_ids, turn.generation_log_probs
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        device: str = "cpu",
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        dtype: str = "float32",
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if temperature is not None and temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        started = time.perf_counter()
        if model_path is None:
            source, kwargs, label = default_model_dir(), {}, DEFAULT_MODEL_NAME
        elif str(model_path).endswith(".gguf"):
            gguf = Path(model_path)
            source, kwargs, label = gguf.parent, {"gguf_file": gguf.name}, gguf.name
        else:
            source, kwargs, label = model_path, {}, str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
        self.model = model.to(device=device, dtype=getattr(torch, dtype)).eval()
        self.load_seconds = time.perf_counter() - started
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.name = f"local:{label}"
        self._renderer = _Renderer(self.tokenizer)
        self._end_ids = self._end_of_turn_ids()
        pad = self.tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else min(self._end_ids)
        self._max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self._lock = threading.Lock()
        self._calls = 0
        self._recent: OrderedDict[str, list[int]] = OrderedDict()
        log.info("loaded %s on %s in %.1f s", label, device, self.load_seconds)

    def _end_of_turn_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
        ids.discard(None)
        if not ids:
            raise ValueError("the model declares no end-of-sequence token; LocalPolicy cannot tell when a turn ends")
        return {int(i) for i in ids}

    def __repr__(self) -> str:
        return f"LocalPolicy(name={self.name!r}, device={self.device!r}, seed={self.seed!r})"

    # ---- prompts -----------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _previous_tokens(self, history: list[dict[str, Any]]) -> tuple[list[int] | None, int]:
        """Every token of this policy's last turn in ``history`` (prompt + generation), and where its items end."""
        last = max((n for n, item in enumerate(history) if _is_model_item(item)), default=None)
        if last is None:
            return None, 0
        item = history[last]
        cached = self._recent.get(str(item.get("id")))
        if cached is not None:
            return cached, last + 1
        prompt, generation = item.get("prompt_token_ids"), item.get("generation_token_ids")
        if isinstance(prompt, list) and isinstance(generation, list):
            return list(prompt) + list(generation), last + 1
        return None, last + 1

    def prompt_token_ids(self, request: PolicyRequest) -> list[int]:
        """The prompt the next :meth:`generate` would feed the model for ``request``.

        Extends the previous turn's tokens when the history holds this policy's last turn
        (see the module docstring); renders the whole conversation otherwise.
        """
        tools = tools_to_chat(request.tools)
        template_tools = self._renderer.template_tools(tools)
        seen, end = self._previous_tokens(request.history)
        if seen is not None:
            new = request.history[end:]
            last = self.tokenizer.decode([seen[-1]]) if seen[-1] in self._end_ids else None
            try:
                messages = self._renderer.env_messages(new, history=request.history)
                return seen + self._encode(self._renderer.continuation(messages, template_tools, last))
            except _NoContinuation as exc:
                log.warning("%s: %s; rendering the whole conversation, so this prompt does not extend the "
                            "previous one (NeMo RL will reject the rollout)", self.name, exc)
        instructions = (request.sampling or {}).get("instructions")
        messages = self._renderer.messages(request.input, request.history, tools, instructions)
        return self._encode(self._renderer.render(messages, template_tools, True))

    # ---- generation --------------------------------------------------------------------------

    def _settings(self, request: PolicyRequest, prompt_length: int) -> tuple[float, float, int]:
        sampling = request.sampling or {}
        temperature = self.temperature if self.temperature is not None else sampling.get("temperature", 1.0)
        top_p = self.top_p if self.top_p is not None else sampling.get("top_p", 1.0)
        budget = self.max_new_tokens or sampling.get("max_output_tokens") or 512
        if self._max_positions:
            room = self._max_positions - prompt_length
            if room < 1:
                raise ValueError(f"{self.name}: the prompt has {prompt_length} tokens, the model's context "
                                 f"{self._max_positions}; shorten the episode (max_steps) or the tool outputs")
            budget = min(budget, room)
        return float(1.0 if temperature is None else temperature), float(1.0 if top_p is None else top_p), int(budget)

    def _sample(self, prompt: list[int], temperature: float, top_p: float,
                max_new_tokens: int) -> tuple[list[int], list[float], float]:
        from transformers import GenerationConfig

        sample = temperature > 0
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=sample, eos_token_id=sorted(self._end_ids),
            pad_token_id=self._pad_id, output_scores=True, return_dict_in_generate=True,
            **({"temperature": temperature, "top_p": top_p, "top_k": 0} if sample else {}),
        )
        inputs = torch.tensor([prompt], device=self.model.device)
        seed = None if self.seed is None else self.seed + self._calls
        self._calls += 1
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=seed is not None), torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            started = time.perf_counter()
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config)
            elapsed = time.perf_counter() - started
        generated = out.sequences[0, len(prompt):]
        scores = torch.stack(out.scores)[:, 0, :].float()
        log_probs = torch.log_softmax(scores, dim=-1).gather(1, generated[:, None]).squeeze(1)
        return generated.tolist(), log_probs.tolist(), elapsed

    def _turn(self, request: PolicyRequest) -> PolicyTurn:
        # One turn at a time per model; the tokenizer is not safe to share between threads either.
        with self._lock:
            prompt = self.prompt_token_ids(request)
            temperature, top_p, budget = self._settings(request, len(prompt))
            generated, log_probs, elapsed = self._sample(prompt, temperature, top_p, budget)
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            items = parse_model_text(text, id_prefix=uuid.uuid4().hex[:12])
            if not items:  # the token data needs an item to ride on
                items = [{"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                          "status": "completed", "content": [{"type": "output_text", "text": "", "annotations": []}]}]
            self._remember(items[-1]["id"], prompt + generated)
        log.debug("%s: %d prompt tokens, %d generated in %.2f s (%.1f tokens/s)", self.name, len(prompt),
                  len(generated), elapsed, len(generated) / elapsed if elapsed else float("inf"))
        return PolicyTurn(items=items, prompt_token_ids=prompt, generation_token_ids=generated,
                          generation_log_probs=log_probs, text=text)

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        """Generate one turn in a worker thread; see the module docstring for the token data.

        Raises:
            ValueError: The prompt does not fit the model's context, or the history holds an
                item the template cannot render.
        """
        return await asyncio.to_thread(self._turn, request)

    def _remember(self, item_id: str, tokens: list[int]) -> None:
        self._recent[item_id] = tokens
        while len(self._recent) > _RECENT_TURNS:
            self._recent.popitem(last=False)
