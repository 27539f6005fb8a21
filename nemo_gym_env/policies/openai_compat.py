"""``OpenAIPolicy``: any OpenAI-compatible endpoint (OpenAI, vLLM, ...) as a policy.

Two wire APIs:

- ``api="responses"``: ``POST /v1/responses`` with the task input plus the episode history
  as ``input``, the task's tools and sampling; the reply's ``output`` items are the turn.
- ``api="chat"``: ``POST /v1/chat/completions``; items and tools are converted with
  :mod:`nemo_gym_env.policies.chat`, and the assistant message converted back.

The wire: request bodies are built as plain JSON and sent on the package's own pooled HTTP
transport (:mod:`nemo_gym_env.client.transport`, the one the resources client uses), at most
``concurrency`` requests in flight per event loop; each reply is decoded once. The ``openai``
SDK is not on the request path: its types stay the schema, and
``tests/policies/test_openai_wire.py`` checks that these bodies are what the SDK would send and
that the parsed items agree with its models, item type by item type.

Retries: 408/409/429/5xx replies, connection failures, connections closed before a complete
reply and timeouts are retried ``max_retries`` times with exponential backoff (0.5 s doubling,
at most 8 s, jittered) or the server's ``Retry-After`` / ``retry-after-ms`` (when 0-60 s), as
the ``openai`` SDK does. Retrying is safe: a model call changes nothing on the server, so a
repeated one costs compute, never state. A 2xx reply that is not JSON, or JSON of the wrong
shape, is not retried. Every attempt has a timeout (``timeout_s``); a turn's attempts, retries
and waits end by its deadline (``turn_timeout_s``, :class:`~nemo_gym_env.policies.retries.Deadline`).
Then a :class:`PolicyTimeout` says no reply came in time, or a :class:`PolicyError` names the
status that came (a 429 is never a timeout). An endpoint that refused every connection of a
turn and never answered (or of ``2 x concurrency`` turns in a row) is marked
:attr:`~nemo_gym_env.policies.base.Policy.unreachable`, which stops a rollouts run. The API key
never appears in a message, log line or ``repr``.

Token data: when the endpoint returns it, the turn carries ``prompt_token_ids``,
``generation_token_ids`` and ``generation_log_probs``. Read from chat replies: vLLM's
``return_token_ids`` fields (top-level ``prompt_token_ids``, ``choices[0].token_ids``),
``choices[0].logprobs.content[*].logprob`` (with ``token_id:N`` tokens when
``return_tokens_as_token_ids`` is on), and NeMo Gym's per-message
``prompt_token_ids``/``generation_token_ids``/``generation_log_probs``; from Responses
replies, the same three fields on output items. ``token_data=True`` asks a vLLM chat
endpoint for them. Whether each prompt extends the previous one (docs/architecture.md, "The wire") is up to the
server's tokenization; a policy that sees it broken logs a warning. The reply's ``usage``
(input and output tokens) rides on the turn (``PolicyTurn.input_tokens``, ``output_tokens``) into the rollout's
``response.usage``.

Example:
    >>> policy = OpenAIPolicy("my-model", base_url="http://127.0.0.1:8000/v1", api_key="sk-secret", api="chat")
    >>> policy
    OpenAIPolicy(model='my-model', base_url='http://127.0.0.1:8000/v1', api='chat', api_key='***')
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from nemo_gym_env.client.transport import HttpClient, Reply
from nemo_gym_env.errors import ConnectFailed, EndpointUnreachable, PolicyError, PolicyTimeout, TransportError
from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn
from nemo_gym_env.policies.chat import (
    ReasoningFormat,
    chat_message_to_items,
    responses_to_chat_messages,
    tools_to_chat,
)
from nemo_gym_env.policies.replies import chat_token_data, float_list, int_list, reply_usage
from nemo_gym_env.policies.retries import Deadline, retry_delay, should_retry
from nemo_gym_env.protocol.items import plain, without_token_fields
from nemo_gym_env.system.redaction import REDACTED, redact_text

try:  # a faster JSON codec when installed; the standard library otherwise
    import orjson

    def _dumps(value: Any) -> bytes:
        return orjson.dumps(value)

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    import json

    def _dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()

    _loads = json.loads

__all__ = ["OpenAIPolicy", "PolicyError", "PolicyTimeout", "chat_token_data", "reply_usage"]

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
"""Where a policy without ``base_url`` sends its requests (``OPENAI_BASE_URL`` overrides it)."""

_ACTION_TYPES = ("message", "function_call", "reasoning")
_RESPONSES_SAMPLING = ("temperature", "top_p", "max_output_tokens", "max_tool_calls", "parallel_tool_calls",
                       "tool_choice", "instructions")
_TAGS = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"\s+")


class _Secret:
    """A string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: Any):
        self._value = value

    def reveal(self) -> Any:
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


class OpenAIPolicy(Policy):
    """A model behind an OpenAI-compatible HTTP endpoint.

    Args:
        model: The model name the endpoint serves.
        base_url: Endpoint root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``); None
            means OpenAI (``OPENAI_BASE_URL`` when set, else ``https://api.openai.com/v1``).
        api_key: The key. With ``base_url`` given and no key, ``"EMPTY"`` is sent (vLLM's
            convention): ``OPENAI_API_KEY`` is read only for OpenAI's own endpoint, so the key
            never leaks to another server.
        api: ``"responses"`` or ``"chat"``.
        sampling: Overrides of the task's sampling parameters (``temperature``, ``top_p``,
            ``max_output_tokens``, ``tool_choice``, ``parallel_tool_calls``...), Responses names.
        max_retries: Retries after the first attempt on 408/409/429/5xx, connection errors and
            timeouts (exponential backoff; 0 disables).
        timeout_s: Per-attempt timeout, seconds.
        turn_timeout_s: The deadline of a whole turn, seconds: every attempt, retry and wait
            of one :meth:`generate` ends by it (None: no deadline but the attempts' own).
        token_data: Ask a vLLM chat endpoint for token ids and log-probs (``logprobs`` and
            ``return_token_ids``); leave off for servers that reject unknown parameters.
        reasoning: How earlier reasoning items are sent to a chat endpoint: ``"think"``,
            ``"field"`` (``reasoning_content``) or ``"drop"``.
        extra_body: Extra JSON fields for every request (server-specific parameters).
        concurrency: Requests in flight at once per event loop (None: the transport's pool
            bound); rollout collection sets it to its own concurrency.

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
        turn_timeout_s: float | None = None,
        token_data: bool = False,
        reasoning: ReasoningFormat = "think",
        extra_body: Mapping[str, Any] | None = None,
        concurrency: int | None = None,
    ):
        if api not in ("responses", "chat"):
            raise ValueError(f"api must be 'responses' or 'chat', got {api!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if turn_timeout_s is not None and turn_timeout_s <= 0:
            raise ValueError(f"turn_timeout_s must be > 0 or None, got {turn_timeout_s!r}")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"concurrency must be an int >= 1 or None, got {concurrency!r}")
        self.model = model
        self.base_url = base_url.rstrip("/") if base_url else None
        self.api = api
        self.sampling = dict(sampling or {})
        self.max_retries = max_retries
        self.timeout_s = float(timeout_s)
        self.turn_timeout_s = None if turn_timeout_s is None else float(turn_timeout_s)
        self.token_data = token_data
        self.reasoning = reasoning
        self.extra_body = dict(extra_body or {})
        self.concurrency = concurrency
        self.name = f"openai:{api}:{model}"
        self._api_key = _Secret(api_key) if api_key else None
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpClient] = weakref.WeakKeyDictionary()
        self._headers: _Secret | None = None  # the request headers, the key among them
        self._answered = False  # any HTTP reply ever came back
        self._refused_turns = 0  # turns in a row whose every attempt could not connect

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
            turn = self.parse_chat(await self._post("/chat/completions", self.chat_body(request)))
        else:
            turn = self.parse_responses(await self._post("/responses", self.responses_body(request)))
        self._check_prefix(request.history, turn)
        return turn

    def _params(self, request: PolicyRequest) -> dict[str, Any]:
        params = {k: v for k, v in (request.sampling or {}).items() if k in _RESPONSES_SAMPLING and v is not None}
        params.update(self.sampling)
        return params

    def responses_body(self, request: PolicyRequest) -> dict[str, Any]:
        """The JSON body of ``POST /responses`` for ``request`` (``extra_body`` merged in)."""
        items = [{"role": "user", "content": request.input}] if isinstance(request.input, str) else request.input
        body: dict[str, Any] = {"model": self.model,
                                "input": [without_token_fields(i) for i in [*items, *request.history]]}
        if request.tools:
            body["tools"] = [plain(t) for t in request.tools]
        params = self._params(request)
        if not request.tools:
            params.pop("tool_choice", None)
            params.pop("parallel_tool_calls", None)
        if "tool_choice" in params:
            params["tool_choice"] = plain(params["tool_choice"])
        body.update(params)
        body.update(self.extra_body)
        return body

    def chat_body(self, request: PolicyRequest) -> dict[str, Any]:
        """The JSON body of ``POST /chat/completions`` for ``request`` (``extra_body`` merged in)."""
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
        if self.token_data:
            body["logprobs"] = True
            body["return_token_ids"] = True
        body.update(self.extra_body)
        return body

    def parse_responses(self, reply: Any) -> PolicyTurn:
        """The turn in a ``/responses`` reply (decoded JSON).

        Raises:
            PolicyError: The reply is not a Response.
        """
        output = reply.get("output") if isinstance(reply, dict) else None
        if not isinstance(output, list):
            raise PolicyError(self._redact(f"{self._where()} replied with something that is not a Response: "
                                           f"{_preview(reply)}; check that base_url points at an "
                                           "OpenAI-compatible /v1 root"))
        prompt = generation = log_probs = None
        items_out: list[dict[str, Any]] = []
        for item in output:
            if not isinstance(item, dict) or item.get("type") not in _ACTION_TYPES:
                log.warning("%s: dropping output item of type %r (not an env action)", self._where(),
                            item.get("type") if isinstance(item, dict) else type(item).__name__)
                continue
            if int_list(item.get("generation_token_ids")) is not None:
                prompt = int_list(item.get("prompt_token_ids"))
                generation = int_list(item["generation_token_ids"])
                log_probs = float_list(item.get("generation_log_probs"))
            items_out.append(without_token_fields(item))
        return _turn(items_out, prompt, generation, log_probs, reply_usage(reply), self._where())

    def parse_chat(self, reply: Any) -> PolicyTurn:
        """The turn in a ``/chat/completions`` reply (decoded JSON).

        Raises:
            PolicyError: The reply is not a chat completion, or its message is unusable.
        """
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
                or not isinstance(choices[0].get("message"), dict):
            raise PolicyError(self._redact(f"{self._where()} replied with something that is not a chat completion: "
                                           f"{_preview(reply)}; check that base_url points at an "
                                           "OpenAI-compatible /v1 root"))
        try:
            items = chat_message_to_items(choices[0]["message"], uuid.uuid4().hex[:12])
        except ValueError as exc:
            raise PolicyError(self._redact(f"{self._where()} replied with an unusable message: {exc}")) from None
        return _turn(items, *chat_token_data(reply), reply_usage(reply), self._where())

    # ---- the wire ------------------------------------------------------------------------------

    def _http(self) -> HttpClient:
        """One client per event loop (its in-flight bound belongs to that loop; the pool is shared)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            base = self.base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_BASE_URL
            client = HttpClient(base, connect_retries=0, max_in_flight=self.concurrency)
            self._clients[loop] = client
        return client

    def _request_headers(self) -> list[tuple[str, str]]:
        if self._headers is None:
            if self._api_key is not None:
                key: str | None = self._api_key.reveal()
            elif self.base_url is None:
                key = os.environ.get("OPENAI_API_KEY")  # for OpenAI's own endpoint only
            else:
                key = "EMPTY"
            headers = [("Content-Type", "application/json")]
            if key:
                headers.append(("Authorization", f"Bearer {key}"))
                if self._api_key is None and self.base_url is None:
                    self._api_key = _Secret(key)  # OPENAI_API_KEY: redacted as well
            self._headers = _Secret(headers)
        return self._headers.reveal()

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` and return the decoded 2xx reply, retrying what may be retried, by the turn's deadline.

        Raises:
            PolicyTimeout: No reply came in time (every attempt timed out, or the deadline passed).
            EndpointUnreachable: The endpoint refuses every connection (see the module docstring).
            PolicyError: Replies came but none was a usable 2xx, or the reply was malformed.
        """
        if self.unreachable is not None:
            raise EndpointUnreachable(self.unreachable)
        data = _dumps(body)
        headers = self._request_headers()
        http = self._http()
        deadline = Deadline(self.turn_timeout_s)
        attempt = 0
        refused = True  # every attempt so far could not connect
        while True:
            reply: Reply | None = None
            problem: Exception | None = None
            try:
                reply = await http.request("POST", path, data, headers=headers,
                                           timeout_s=deadline.attempt_timeout(self.timeout_s))
            except (TimeoutError, ConnectFailed, TransportError) as exc:
                problem = exc
            refused = refused and isinstance(problem, ConnectFailed)
            if reply is not None:
                self._answered = True
                self._refused_turns = 0
                log.debug("%s: POST %s -> HTTP %d (attempt %d)", self._where(), path, reply.status_code, attempt + 1)
                if reply.is_success:
                    try:
                        return _loads(reply.content)
                    except ValueError as exc:
                        raise PolicyError(self._redact(
                            f"{self._where()}: malformed reply (not JSON: {exc}; body {_preview(reply.text)}); "
                            "check that base_url points at an OpenAI-compatible /v1 root")) from None
                if not should_retry(reply):
                    raise self._status_error(reply)
            else:
                log.debug("%s: POST %s failed (attempt %d): %s", self._where(), path, attempt + 1,
                          type(problem).__name__)
            if attempt >= self.max_retries:
                raise self._final_error(reply, problem, attempt, refused)
            delay = retry_delay(attempt, reply.headers if reply is not None else None)
            if not deadline.allows_wait(delay):
                raise self._final_error(reply, problem, attempt, refused, waiting=delay)
            await asyncio.sleep(delay)
            attempt += 1

    async def first_reply(self, timeout_s: float) -> tuple[str, float]:
        """Send one one-token request and wait up to ``timeout_s`` for any answer.

        A server that loads its model at its first request (``transformers serve``, a server still
        warming up) is cold, not hung: its first answer may take minutes, and the per-turn limits
        (:data:`ENDPOINT_DEFAULTS`) would fail every rollout meanwhile.

        Returns:
            What came and after how many seconds: ``"answered"`` (any HTTP status), ``"silent"``
            (connected, no answer within ``timeout_s``), ``"refused"`` (nothing listening) or
            ``"failed"`` (a cut connection or a malformed reply). Only ``"silent"`` takes long; the
            rollouts report the other failures as they always do.
        """
        if self.api == "chat":
            path, body = "/chat/completions", {"model": self.model, "max_tokens": 1,
                                                "messages": [{"role": "user", "content": "Hi"}]}
        else:  # 16: the smallest max_output_tokens the Responses API takes
            path, body = "/responses", {"model": self.model, "max_output_tokens": 16,
                                        "input": [{"role": "user", "content": "Hi"}]}
        started = time.monotonic()
        try:
            reply = await self._http().request("POST", path, _dumps({**body, **self.extra_body}),
                                               headers=self._request_headers(), timeout_s=timeout_s)
        except TimeoutError:
            outcome = "silent"
        except ConnectFailed:
            outcome = "refused"
        except TransportError:
            outcome = "failed"
        else:
            self._answered = True
            outcome = "answered"
            log.debug("%s: first reply HTTP %d", self._where(), reply.status_code)
        return outcome, time.monotonic() - started

    # ---- errors and checks -------------------------------------------------------------------

    def _where(self) -> str:
        return f"OpenAI-compatible endpoint {_safe_url(self.base_url) or 'api.openai.com'} (model {self.model!r}, {self.api} API)"

    def _redact(self, text: str) -> str:
        """``text`` without the key (anywhere when it is 4+ characters, as a whole word when shorter) or secret shapes."""
        if self._api_key is not None and self._api_key.reveal():
            key = self._api_key.reveal()
            if len(key) >= 4:
                text = text.replace(key, REDACTED)
            else:  # a short key would scrub ordinary words: only where it stands alone
                text = re.sub(rf"(?<![\w\-]){re.escape(key)}(?![\w\-])", REDACTED, text)
        return redact_text(text)

    def _final_error(self, reply: Reply | None, problem: Exception | None, attempt: int, refused: bool, *,
                     waiting: float | None = None) -> PolicyError:
        """The error a turn ends with: the last reply's status, or what the last attempt ran into."""
        if refused:
            self._refused_turns += 1
            needed = 1 if not self._answered else 2 * (self.concurrency or 8)
            if self._refused_turns >= needed and self.unreachable is None:
                self.unreachable = self._redact(
                    f"{self._where()} refuses every connection ({problem}); check that it is up and that "
                    "base_url (policy_base_url) is right")
        tries = f"after {attempt} retr{'y' if attempt == 1 else 'ies'}" if attempt else "with no retry"
        if waiting is not None:
            tries += (f" (a retry in {waiting:.1f} s would pass the turn's deadline of {self.turn_timeout_s:g} s, "
                      "turn_timeout_s / --turn-timeout)")
        if reply is not None:
            return self._status_error(reply, tries)
        if isinstance(problem, TimeoutError):
            limit = f"each attempt {self.timeout_s:g} s (timeout_s / --attempt-timeout)" + (
                "" if self.turn_timeout_s is None else f", the turn {self.turn_timeout_s:g} s (turn_timeout_s / --turn-timeout)")
            return PolicyTimeout(self._redact(f"{self._where()}: no reply in time, {tries}: {limit}; raise them for "
                                              "long generations, or check the server"))
        if isinstance(problem, ConnectFailed):
            why = f"cannot connect ({problem}), {tries}; check that the server is up and base_url is right"
        else:
            why = f"the connection failed before a complete reply ({problem}), {tries}; check the server's logs"
        return PolicyError(self._redact(f"{self._where()}: {why}"))

    def _status_error(self, reply: Reply, tries: str = "") -> PolicyError:
        status = reply.status_code
        hint = {401: "check policy_api_key", 403: "check policy_api_key", 404: "check base_url (it ends in /v1) "
                "and the model name", 429: "the endpoint is rate limiting; lower concurrency or raise max_retries"}
        advice = hint.get(status, "the server failed; check its logs" if status >= 500 else "the request was rejected")
        message = f"{self._where()}: HTTP {status}{' ' * bool(tries)}{tries}: {_preview(_error_text(reply))} ({advice})"
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
        """Forget this event loop's client; its connections belong to the loop's shared pool."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - aclose is always awaited
            return
        self._clients.pop(loop, None)


def _error_text(reply: Reply) -> str:
    """The message of an error reply: ``error.message`` of a JSON body, else its text without markup."""
    try:
        body = _loads(reply.content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if isinstance(body.get("detail"), str):
            return body["detail"]
    text = _SPACES.sub(" ", _TAGS.sub(" ", reply.text)).strip()
    return text or "(empty body)"


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


def _turn(items: list[dict[str, Any]], prompt: list[int] | None, generation: list[int] | None,
          log_probs: list[float] | None, usage: dict[str, int] | None, where: str) -> PolicyTurn:
    if log_probs is not None and generation is not None and len(log_probs) != len(generation):
        log.warning("%s returned %d log-probs for %d generated tokens; dropping the log-probs",
                    where, len(log_probs), len(generation))
        log_probs = None
    if generation is None:
        prompt = log_probs = None
    if not items:
        items = [{"type": "message", "role": "assistant", "status": "completed",
                  "content": [{"type": "output_text", "text": "", "annotations": []}]}]
    input_tokens, output_tokens = (usage["input_tokens"], usage["output_tokens"]) if usage else (0, 0)
    if not (input_tokens or output_tokens) and generation is not None:  # no usage: count the token data
        input_tokens, output_tokens = len(prompt or []), len(generation)
    return PolicyTurn(items=items, prompt_token_ids=prompt, generation_token_ids=generation,
                      generation_log_probs=log_probs, input_tokens=input_tokens, output_tokens=output_tokens)
