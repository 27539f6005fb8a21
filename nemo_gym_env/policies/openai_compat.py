"""``OpenAIPolicy``: any OpenAI-compatible endpoint (OpenAI, vLLM, ...) as a policy.

Two wire APIs:

- ``api="responses"``: ``POST /v1/responses`` with the task input plus the episode history
  as ``input``, the task's tools and sampling; the reply's ``output`` items are the turn.
- ``api="chat"``: ``POST /v1/chat/completions``; items and tools are converted with
  :mod:`nemo_gym_env.policies.chat`, and the assistant message converted back.

Retries: the ``openai`` SDK retries 408/409/429/5xx replies and connection errors and
timeouts, ``max_retries`` times, with exponential backoff (0.5 s doubling, at most 8 s,
jittered) or the server's ``Retry-After``. After that, a :class:`PolicyError` says what
failed and what to check. The API key never appears in a message, log line or ``repr``.

Token data: when the endpoint returns it, the turn carries ``prompt_token_ids``,
``generation_token_ids`` and ``generation_log_probs``. Read from chat replies: vLLM's
``return_token_ids`` fields (top-level ``prompt_token_ids``, ``choices[0].token_ids``),
``choices[0].logprobs.content[*].logprob`` (with ``token_id:N`` tokens when
``return_tokens_as_token_ids`` is on), and NeMo Gym's per-message
``prompt_token_ids``/``generation_token_ids``/``generation_log_probs``; from Responses
replies, the same three fields on output items. ``token_data=True`` asks a vLLM chat
endpoint for them. Whether each prompt extends the previous one (docs/architecture.md, "The wire") is up to the
server's tokenization; a policy that sees it broken logs a warning.

Example:
    >>> policy = OpenAIPolicy("my-model", base_url="http://127.0.0.1:8000/v1", api_key="sk-secret", api="chat")
    >>> policy
    OpenAIPolicy(model='my-model', base_url='http://127.0.0.1:8000/v1', api='chat', api_key='***')
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import openai

from nemo_gym_env.errors import PolicyError
from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn
from nemo_gym_env.policies.chat import (
    ReasoningFormat,
    chat_message_to_items,
    responses_to_chat_messages,
    tools_to_chat,
)
from nemo_gym_env.protocol.items import plain, without_token_fields

__all__ = ["OpenAIPolicy", "PolicyError"]

log = logging.getLogger(__name__)

_ACTION_TYPES = ("message", "function_call", "reasoning")
_RESPONSES_SAMPLING = ("temperature", "top_p", "max_output_tokens", "max_tool_calls", "parallel_tool_calls",
                       "tool_choice", "instructions")
_SECRET_SHAPES = re.compile(r"(Bearer\s+)\S+|\bsk-[A-Za-z0-9_\-]{6,}", re.IGNORECASE)


class _Secret:
    """A string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


def _safe_url(url: str | None) -> str | None:
    """``url`` without any ``user:password@``."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def _float_list(value: Any) -> list[float] | None:
    if isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return [float(v) for v in value]
    return None


def chat_token_data(reply: Mapping[str, Any]) -> tuple[list[int] | None, list[int] | None, list[float] | None]:
    """``(prompt_token_ids, generation_token_ids, generation_log_probs)`` of a chat reply, each None if absent.

    Example:
        >>> chat_token_data({"prompt_token_ids": [1, 2], "choices": [{"token_ids": [3],
        ...     "logprobs": {"content": [{"token": "token_id:3", "logprob": -0.5}]}, "message": {}}]})
        ([1, 2], [3], [-0.5])
    """
    choice = (reply.get("choices") or [{}])[0] or {}
    message = choice.get("message") or {}
    prompt = _int_list(reply.get("prompt_token_ids")) or _int_list(message.get("prompt_token_ids"))
    generation = _int_list(choice.get("token_ids")) or _int_list(message.get("generation_token_ids"))
    content = ((choice.get("logprobs") or {}).get("content")) or []
    log_probs = _float_list([entry.get("logprob") for entry in content if isinstance(entry, dict)]) if content else None
    if generation is None and content:
        tokens = [str(entry.get("token", "")) for entry in content if isinstance(entry, dict)]
        if tokens and all(t.startswith("token_id:") and t[9:].lstrip("-").isdigit() for t in tokens):
            generation = [int(t[9:]) for t in tokens]
    if log_probs is None:
        log_probs = _float_list(message.get("generation_log_probs"))
    return prompt, generation, log_probs


class OpenAIPolicy(Policy):
    """A model behind an OpenAI-compatible HTTP endpoint.

    Args:
        model: The model name the endpoint serves.
        base_url: Endpoint root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``); None
            means OpenAI (or ``OPENAI_BASE_URL``).
        api_key: The key. With ``base_url`` given and no key, ``"EMPTY"`` is sent (vLLM's
            convention): ``OPENAI_API_KEY`` is read only for OpenAI's own endpoint, so the key
            never leaks to another server.
        api: ``"responses"`` or ``"chat"``.
        sampling: Overrides of the task's sampling parameters (``temperature``, ``top_p``,
            ``max_output_tokens``, ``tool_choice``, ``parallel_tool_calls``...), Responses names.
        max_retries: Retries after the first attempt on 408/409/429/5xx, connection errors and
            timeouts (exponential backoff; 0 disables).
        timeout_s: Per-attempt timeout.
        token_data: Ask a vLLM chat endpoint for token ids and log-probs (``logprobs`` and
            ``return_token_ids``); leave off for servers that reject unknown parameters.
        reasoning: How earlier reasoning items are sent to a chat endpoint: ``"think"``,
            ``"field"`` (``reasoning_content``) or ``"drop"``.
        extra_body: Extra JSON fields for every request (server-specific parameters).

    Example:
        >>> policy = OpenAIPolicy.from_config({"policy_base_url": "http://127.0.0.1:8000/v1",
        ...     "policy_api_key": "sk-secret", "policy_model_name": "my-model"}, api="chat")
        >>> policy.model, policy.api
        ('my-model', 'chat')
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api: Literal["responses", "chat"] = "responses",
        sampling: Mapping[str, Any] | None = None,
        max_retries: int = 3,
        timeout_s: float = 120.0,
        token_data: bool = False,
        reasoning: ReasoningFormat = "think",
        extra_body: Mapping[str, Any] | None = None,
    ):
        if api not in ("responses", "chat"):
            raise ValueError(f"api must be 'responses' or 'chat', got {api!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.model = model
        self.base_url = base_url.rstrip("/") if base_url else None
        self.api = api
        self.sampling = dict(sampling or {})
        self.max_retries = max_retries
        self.timeout_s = float(timeout_s)
        self.token_data = token_data
        self.reasoning = reasoning
        self.extra_body = dict(extra_body or {})
        self.name = f"openai:{api}:{model}"
        self._api_key = _Secret(api_key) if api_key else None
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **overrides: Any) -> OpenAIPolicy:
        """A policy from a loaded config's ``policy_base_url``, ``policy_api_key``, ``policy_model_name``.

        Args:
            config: A mapping (or OmegaConf config) such as :func:`nemo_gym_env.launch.config.load_config`
                returns; ``env.yaml`` usually holds these keys.
            **overrides: Any other constructor argument (``api``, ``sampling``...).

        Raises:
            ValueError: No ``policy_model_name``.
        """
        model = overrides.pop("model", None) or _config_value(config, "policy_model_name")
        if not model:
            raise ValueError("config has no policy_model_name: set it in env.yaml or pass model=...")
        return cls(
            str(model),
            base_url=overrides.pop("base_url", None) or _config_value(config, "policy_base_url"),
            api_key=overrides.pop("api_key", None) or _config_value(config, "policy_api_key"),
            **overrides,
        )

    def __repr__(self) -> str:
        key = "'***'" if self._api_key is not None else "None"
        return (f"{type(self).__name__}(model={self.model!r}, base_url={_safe_url(self.base_url)!r}, "
                f"api={self.api!r}, api_key={key})")

    # ---- the call ----------------------------------------------------------------------------

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        """One model call for ``request``; see the module docstring.

        Raises:
            PolicyError: The endpoint failed after retries, timed out, or replied with
                something that is not a completion.
        """
        if self.api == "chat":
            turn = await self._chat(request)
        else:
            turn = await self._responses(request)
        self._check_prefix(request.history, turn)
        return turn

    def _client(self) -> openai.AsyncOpenAI:
        """One SDK client per event loop (its connection pool belongs to that loop)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            if self._api_key is not None:
                key = self._api_key.reveal()
            elif self.base_url is None:
                key = None  # the SDK reads OPENAI_API_KEY, for OpenAI's own endpoint only
            else:
                key = "EMPTY"
            client = openai.AsyncOpenAI(
                api_key=key, base_url=self.base_url, max_retries=self.max_retries, timeout=self.timeout_s
            )
            self._clients[loop] = client
        return client

    def _params(self, request: PolicyRequest) -> dict[str, Any]:
        params = {k: v for k, v in (request.sampling or {}).items() if k in _RESPONSES_SAMPLING and v is not None}
        params.update(self.sampling)
        return params

    async def _responses(self, request: PolicyRequest) -> PolicyTurn:
        items = [{"role": "user", "content": request.input}] if isinstance(request.input, str) else request.input
        body: dict[str, Any] = {"model": self.model,
                                "input": [without_token_fields(i) for i in [*items, *request.history]]}
        if request.tools:
            body["tools"] = [plain(t) for t in request.tools]
        body.update(self._params(request))
        if not request.tools:
            body.pop("tool_choice", None)
            body.pop("parallel_tool_calls", None)
        reply = await self._send(self._client().responses.create(**body, extra_body=self.extra_body or None))
        output = reply.get("output") if isinstance(reply, dict) else None
        if not isinstance(output, list):
            raise PolicyError(f"{self._where()} replied with something that is not a Response: {_preview(reply)}; "
                              "check that base_url points at an OpenAI-compatible /v1 root")
        prompt = generation = log_probs = None
        items_out: list[dict[str, Any]] = []
        for raw in output:
            item = plain(raw)
            if not isinstance(item, dict) or item.get("type") not in _ACTION_TYPES:
                log.warning("%s: dropping output item of type %r (not an env action)", self._where(),
                            item.get("type") if isinstance(item, dict) else type(item).__name__)
                continue
            if _int_list(item.get("generation_token_ids")) is not None:
                prompt = _int_list(item.get("prompt_token_ids"))
                generation = _int_list(item["generation_token_ids"])
                log_probs = _float_list(item.get("generation_log_probs"))
            items_out.append(without_token_fields(item))
        return _turn(items_out, prompt, generation, log_probs, self._where(), reply)

    async def _chat(self, request: PolicyRequest) -> PolicyTurn:
        params = self._params(request)
        messages = responses_to_chat_messages(
            request.input, request.history, instructions=params.pop("instructions", None), reasoning=self.reasoning
        )
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        tools = tools_to_chat(request.tools)
        if tools:
            body["tools"] = tools
            if "tool_choice" in params:
                body["tool_choice"] = _chat_tool_choice(params["tool_choice"])
            if "parallel_tool_calls" in params:
                body["parallel_tool_calls"] = params["parallel_tool_calls"]
        for key in ("temperature", "top_p"):
            if key in params:
                body[key] = params[key]
        if params.get("max_output_tokens") is not None:
            body["max_completion_tokens"] = params["max_output_tokens"]
        extra = dict(self.extra_body)
        if self.token_data:
            body["logprobs"] = True
            extra.setdefault("return_token_ids", True)
        reply = await self._send(self._client().chat.completions.create(**body, extra_body=extra or None))
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
                or not isinstance(choices[0].get("message"), dict):
            raise PolicyError(f"{self._where()} replied with something that is not a chat completion: "
                              f"{_preview(reply)}; check that base_url points at an OpenAI-compatible /v1 root")
        try:
            items = chat_message_to_items(choices[0]["message"], uuid.uuid4().hex[:12])
        except ValueError as exc:
            raise PolicyError(f"{self._where()} replied with an unusable message: {exc}") from None
        return _turn(items, *chat_token_data(reply), self._where(), reply)

    # ---- errors and checks -------------------------------------------------------------------

    async def _send(self, call: Any) -> Any:
        """Await one SDK call (retries included); failures become a :class:`PolicyError`."""
        try:
            return plain(await call)
        except openai.APIError as exc:
            raise self._error(exc) from None
        except ValueError as exc:  # a body the SDK could not decode
            raise PolicyError(self._redact(f"{self._where()}: malformed reply ({type(exc).__name__}: "
                                           f"{_preview(str(exc))}); check that base_url points at an "
                                           "OpenAI-compatible /v1 root")) from None

    def _where(self) -> str:
        return f"OpenAI-compatible endpoint {_safe_url(self.base_url) or 'api.openai.com'} (model {self.model!r}, {self.api} API)"

    def _redact(self, text: str) -> str:
        if self._api_key is not None and self._api_key.reveal():
            text = text.replace(self._api_key.reveal(), "***")
        return _SECRET_SHAPES.sub(lambda m: (m.group(1) or "") + "***", text)

    def _error(self, exc: openai.APIError) -> PolicyError:
        where = self._where()
        retried = f"after {self.max_retries} retr{'y' if self.max_retries == 1 else 'ies'}"
        if isinstance(exc, openai.APITimeoutError):
            message = f"{where}: no reply within {self.timeout_s:g} s, {retried}; raise timeout_s or check the server"
            status = None
        elif isinstance(exc, openai.APIConnectionError):
            message = f"{where}: cannot connect ({exc}), {retried}; check that the server is up and base_url is right"
            status = None
        elif isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            hint = {401: "check policy_api_key", 403: "check policy_api_key", 404: "check base_url (it ends in /v1) "
                    "and the model name", 429: "the endpoint is rate limiting; lower concurrency or raise max_retries"}
            advice = hint.get(status, "the server failed; check its logs" if status >= 500 else "the request was rejected")
            after = f" {retried}" if status >= 500 or status in (408, 409, 429) else ""
            message = f"{where}: HTTP {status}{after}: {_preview(exc.message)} ({advice})"
        else:
            status = None
            message = f"{where}: malformed reply ({type(exc).__name__}: {_preview(str(exc))}); " \
                      "check that base_url points at an OpenAI-compatible /v1 root"
        return PolicyError(self._redact(message), status_code=status)

    def _check_prefix(self, history: list[dict[str, Any]], turn: PolicyTurn) -> None:
        if turn.prompt_token_ids is None:
            return
        last = next((i for i in reversed(history) if isinstance(i, dict) and "generation_token_ids" in i), None)
        if last is None:
            return
        seen = list(last.get("prompt_token_ids") or []) + list(last["generation_token_ids"])
        if turn.prompt_token_ids[: len(seen)] != seen:
            log.warning("%s re-tokenized the conversation: this call's prompt_token_ids do not start with the "
                        "previous call's tokens, so NeMo RL will reject the rollout", self._where())

    async def aclose(self) -> None:
        """Close this event loop's HTTP client (others are dropped with their loops)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - aclose is always awaited
            return
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.close()


def _config_value(config: Mapping[str, Any], key: str) -> Any:
    """``config[key]``, or None when absent or still ``???`` in an OmegaConf config."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(config, DictConfig):
        return None if key not in config or OmegaConf.is_missing(config, key) else config[key]
    return config.get(key)


def _chat_tool_choice(choice: Any) -> Any:
    choice = plain(choice)
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _preview(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _reply_usage(reply: Any) -> tuple[int, int]:
    """``(input, output)`` tokens of a Responses or Chat Completions reply's ``usage``; (0, 0) without one.

    Example:
        >>> _reply_usage({"usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
        (12, 3)
    """
    usage = reply.get("usage") if isinstance(reply, dict) else None
    if not isinstance(usage, dict):
        return 0, 0

    def count(*keys: str) -> int:
        value = next((usage[k] for k in keys if k in usage), 0)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    return count("input_tokens", "prompt_tokens"), count("output_tokens", "completion_tokens")


def _turn(items: list[dict[str, Any]], prompt: list[int] | None, generation: list[int] | None,
          log_probs: list[float] | None, where: str, reply: Any = None) -> PolicyTurn:
    if log_probs is not None and generation is not None and len(log_probs) != len(generation):
        log.warning("%s returned %d log-probs for %d generated tokens; dropping the log-probs",
                    where, len(log_probs), len(generation))
        log_probs = None
    if generation is None:
        prompt = log_probs = None
    if not items:
        items = [{"type": "message", "role": "assistant", "status": "completed",
                  "content": [{"type": "output_text", "text": "", "annotations": []}]}]
    input_tokens, output_tokens = _reply_usage(reply)
    if not (input_tokens or output_tokens) and generation is not None:  # no usage: count the token data
        input_tokens, output_tokens = len(prompt or []), len(generation)
    return PolicyTurn(items=items, prompt_token_ids=prompt, generation_token_ids=generation,
                      generation_log_probs=log_probs, input_tokens=input_tokens, output_tokens=output_tokens)
