"""``LocalPolicy``: a Hugging Face transformers model in this process, keeping token data per turn.

Prompts come from the tokenizer's chat template. When the template takes tools
(``apply_chat_template(..., tools=...)`` renders them), tools go there and tool outputs are
``tool`` messages. Otherwise (SmolLM2's template ignores tools) the tool schemas are written
into the system prompt in Hermes form (``<tools>`` JSON lines and the ``<tool_call>`` reply
format) and tool outputs come back as user turns of ``<tool_response>`` blocks. The model's
text is parsed by :func:`~nemo_gym_env.protocol.parser.parse_model_text`.

Token invariant (docs/architecture.md, "The wire"): the model's own tokens are never re-tokenized. Turn k's prompt is
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

Concurrency: turns of concurrent episodes are generated together. Prompt building runs in a
worker thread (``asyncio.to_thread``, one at a time: the tokenizer is not safe to share), then
the prompt joins the queue of a :class:`~nemo_gym_env.policies.batching.BatchGenerator`, whose
one thread decodes the running turns together (up to ``max_batch_size``): an arriving prompt is
prefilled on its own and joins the batch between decoding steps, a finished turn leaves it at
once, and each row keeps its own sampling settings, budget and end-of-turn stop (models whose
cache cannot be rearranged run fixed batches through ``model.generate``). Each turn gets back exactly its own tokens, so the token invariant holds
as for a turn generated alone, and the event loop stays free throughout. The key/value states
of finished turns are kept (``prefix_cache_mb``), so a turn computes only the tokens its
episode added since its previous turn. A greedy turn drafts up to ``draft_tokens`` tokens a step
from its own context and keeps those the model chooses itself (:mod:`~nemo_gym_env.policies.drafts`):
its tokens are the ones it decodes one at a time, in fewer steps. A model that raises fails the
turns of that batch only (``PolicyError`` with the cause).

Reproducibility: temperature 0 is greedy; batched, it gives the tokens it gives alone (see
:mod:`~nemo_gym_env.policies.batching` for the float-rounding caveat). With ``seed`` set, the
n-th call to :meth:`LocalPolicy.generate` samples with its own generator seeded ``seed + n``,
whichever turns share its batch: two policies with the same seed given the same requests in
the same order produce the same tokens, one at a time or concurrently.

Usage: each turn carries ``input_tokens`` (the prompt's length) and ``output_tokens`` (the
generated tokens), which rollouts sum into the verify body's ``response.usage``.

Example (the first use downloads 93 MB and writes about 640 MB to the cache)::

    policy = LocalPolicy(max_new_tokens=64, temperature=0.7, seed=0)
    turn = await policy.generate(PolicyRequest(input=obs, history=[], tools=info["tools"]))
    env.step(turn.action())
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import NoContinuation
from nemo_gym_env.policies.base import Policy, PolicyRequest, PolicyTurn
from nemo_gym_env.policies.batching import BatchGenerator, Generation, GenerationRequest
from nemo_gym_env.policies.chat import tools_to_chat
from nemo_gym_env.policies.factory import LOCAL_DTYPES
from nemo_gym_env.policies.int8 import to_int8
from nemo_gym_env.policies.models import DEFAULT_MODEL_NAME, default_model_dir
from nemo_gym_env.policies.packed import to_packed
from nemo_gym_env.policies.render import ChatRenderer
from nemo_gym_env.protocol.items import is_model_item
from nemo_gym_env.protocol.parser import parse_model_text
from nemo_gym_env.system.cpu import cpu_flags
from nemo_gym_env.system.memory import release_large_blocks

__all__ = ["LocalPolicy", "Sampling", "native_dtype"]

log = logging.getLogger(__name__)

_RECENT_TURNS = 4096


def native_dtype(device: str) -> str:
    """``"bfloat16"`` where ``device`` computes it natively (a CPU with AVX512-BF16 or AMX, a GPU with
    bfloat16), else ``"float32"``: what ``dtype="auto"`` takes.

    On a CPU without those instructions PyTorch emulates bfloat16 matrix products, slower than
    float32. The CPU's flags are :func:`~nemo_gym_env.system.cpu.cpu_flags` (none known outside Linux: float32).
    """
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(cpu_flags()) else "float32"


@dataclass(frozen=True)
class Sampling:
    """A local policy's own sampling settings; each one None takes the task's (``responses_create_params``).

    ``seed``: the n-th turn samples with a generator seeded ``seed + n`` (None: a fresh seed per turn).

    Raises:
        ValueError: a negative temperature, top_p outside (0, 1], a budget under one token.
    """

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def of(self, task: dict[str, Any]) -> tuple[float, float, int]:
        """(temperature, top_p, token budget) of a turn whose task asks ``task`` (its sampling keys):
        these settings first, then the task's, then 1.0, 1.0 and 512 tokens."""
        temperature = self.temperature if self.temperature is not None else task.get("temperature")
        top_p = self.top_p if self.top_p is not None else task.get("top_p")
        budget = self.max_new_tokens or task.get("max_output_tokens") or 512
        return float(1.0 if temperature is None else temperature), float(1.0 if top_p is None else top_p), int(budget)


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
        seed: Makes sampling reproducible (see the module docstring); None draws each call's seed
            from torch's global generator.
        dtype: Weights' dtype (``"float32"``, ``"bfloat16"``, ``"float16"``); ``"auto"``: bfloat16 where
            the device computes it natively (a CPU with AVX512-BF16 or AMX, a GPU with bfloat16),
            else float32; or ``"int8"`` (CPU only:
            bfloat16 with int8 copies of the linear layers' weights for decoding, see
            :mod:`~nemo_gym_env.policies.int8`; tokens differ from float32's).
        max_batch_size: Turns generated together in one ``model.generate`` call.
        batch_wait_s: A batch starts once no turn has arrived for this long and none is being
            prepared (at most a second after its first turn).
        num_threads: torch intra-op threads for generation; None: every CPU this process may
            use, unless ``OMP_NUM_THREADS`` is set (Ray sets it per worker), which then stands.
        prefix_cache_mb: Memory for the key/value states of finished turns, so that a prompt
            extending one (the episode's next turn, another rollout of the same task) computes
            only its new tokens; 0 turns it off. None: 64 MB per byte of the states' dtype
            (128 MB in bfloat16: 8 conversations of 700 tokens of SmolLM2; the least recently
            used go first, which are those of finished episodes). In the README's main job 256 MB
            saved a fifth of the prompt tokens' computation (about 3 s of 85) and raised the peak
            memory by about 70 MB, the difference between the peak and the 1.5 GB it is held to.
        draft_tokens: Tokens a greedy turn may draft a step from its own context, fed with its newest token and
            kept where the model chooses them itself (:mod:`~nemo_gym_env.policies.drafts`): the same tokens in
            fewer steps (tool names and arguments repeat the prompt). 0 decodes one token a step. Sampled turns
            (temperature > 0) decode one token a step either way.
        packed_weights: On the CPU, lay the linear layers' float32 or bfloat16 weights out for oneDNN's matrix
            products once, at load (:mod:`~nemo_gym_env.policies.packed`): decoding steps of a few rows read the
            weights about 1.5 times as fast; the same numbers in bfloat16, float32's last bits differ. False keeps
            transformers' own layers.

    Memory: loading the model sets glibc's allocator to serve blocks of 1 MB or more from
    mappings of their own, unmapped when freed (:func:`~nemo_gym_env.system.memory.release_large_blocks`;
    process-wide; ``NEMO_GYM_ENV_MALLOC_DEFAULTS=1`` leaves glibc as it is): key/value buffers
    rebuilt as turns join and leave otherwise stay in the heap as holes, about a third of the
    README main job's peak (``benchmarks/README.md``, "The main job").

    Attributes:
        load_seconds: How long loading the tokenizer and model took (provisioning included).
        dtype: The weights' dtype in use (``"auto"`` resolved).

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
        max_batch_size: int = 16,
        batch_wait_s: float = 0.05,
        num_threads: int | None = None,
        prefix_cache_mb: float | None = None,
        draft_tokens: int = 4,
        packed_weights: bool = True,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        sampling = Sampling(max_new_tokens, temperature, top_p, seed)
        if dtype not in LOCAL_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(LOCAL_DTYPES)}, got {dtype!r}")
        if dtype == "auto":
            dtype = native_dtype(device)
        if dtype == "int8" and device != "cpu":
            raise ValueError(f"dtype='int8' runs on the CPU only; on {device} take dtype='bfloat16'")
        started = time.perf_counter()
        release_large_blocks()  # before provisioning: converting the default model frees hundreds of MB
        if model_path is None:
            source, kwargs, label = default_model_dir(), {}, DEFAULT_MODEL_NAME
        elif str(model_path).endswith(".gguf"):
            gguf = Path(model_path)
            source, kwargs, label = gguf.parent, {"gguf_file": gguf.name}, gguf.name
        else:
            source, kwargs, label = model_path, {}, str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        load_dtype = "bfloat16" if dtype == "int8" else dtype
        self.model = AutoModelForCausalLM.from_pretrained(source, dtype=load_dtype, **kwargs).to(device).eval()
        if dtype == "int8":
            to_int8(self.model, packed=packed_weights)
        elif packed_weights and device == "cpu":
            to_packed(self.model)
        self.load_seconds = time.perf_counter() - started
        self.device = device
        self.dtype = dtype
        self.sampling = sampling
        self.name = f"local:{label}"
        self._renderer = ChatRenderer(self.tokenizer)
        self._end_ids = self._end_of_turn_ids()
        pad = self.tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else min(self._end_ids)
        self._max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self._lock = threading.Lock()  # the tokenizer and the recent-turns cache
        self._count_lock = threading.Lock()
        self._calls = itertools.count()
        self._preparing = 0  # turns whose prompt is being built: the next batch waits for them
        self._recent: OrderedDict[str, list[int]] = OrderedDict()
        if prefix_cache_mb is None:
            prefix_cache_mb = 64 * next(self.model.parameters()).element_size()
        self._batcher = BatchGenerator(self.model, end_ids=self._end_ids, pad_id=self._pad_id,
                                       max_batch_size=max_batch_size, wait_s=batch_wait_s,
                                       preparing=lambda: self._preparing,
                                       num_threads=num_threads, prefix_cache_mb=prefix_cache_mb,
                                       draft_tokens=draft_tokens, name=self.name)
        log.info("loaded %s (%s) on %s in %.1f s", label, dtype, device, self.load_seconds)

    def _end_of_turn_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        ids.update(configured if isinstance(configured, (list, tuple)) else [configured])
        ids.discard(None)
        if not ids:
            raise ValueError("the model declares no end-of-sequence token; LocalPolicy cannot tell when a turn ends")
        return {int(i) for i in ids}

    def __repr__(self) -> str:
        return f"LocalPolicy(name={self.name!r}, device={self.device!r}, seed={self.sampling.seed!r})"

    # ---- prompts -----------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _previous_tokens(self, history: list[dict[str, Any]]) -> tuple[list[int] | None, int]:
        """Every token of this policy's last turn in ``history`` (prompt + generation), and where its items end."""
        last = max((n for n, item in enumerate(history) if is_model_item(item)), default=None)
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
            except NoContinuation as exc:
                log.warning("%s: %s; rendering the whole conversation, so this prompt does not extend the "
                            "previous one (NeMo RL will reject the rollout)", self.name, exc)
        instructions = (request.sampling or {}).get("instructions")
        messages = self._renderer.messages(request.input, request.history, tools, instructions)
        return self._encode(self._renderer.render(messages, template_tools, True))

    # ---- generation --------------------------------------------------------------------------

    def _settings(self, request: PolicyRequest, prompt_length: int) -> tuple[float, float, int]:
        temperature, top_p, budget = self.sampling.of(request.sampling or {})
        if self._max_positions:
            room = self._max_positions - prompt_length
            if room < 1:
                raise ValueError(f"{self.name}: the prompt has {prompt_length} tokens, the model's context "
                                 f"{self._max_positions}; shorten the episode (max_steps) or the tool outputs")
            budget = min(budget, room)
        return temperature, top_p, budget

    def _prepare(self, request: PolicyRequest) -> tuple[list[int], float, float, int]:
        with self._lock:
            prompt = self.prompt_token_ids(request)
        return (prompt, *self._settings(request, len(prompt)))

    def _finish(self, prompt: list[int], generation: Generation) -> PolicyTurn:
        generated, log_probs = generation.token_ids, generation.log_probs
        with self._lock:
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            items = parse_model_text(text, id_prefix=uuid.uuid4().hex[:12])
            if not items:  # the token data needs an item to ride on
                items = [{"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant",
                          "status": "completed", "content": [{"type": "output_text", "text": "", "annotations": []}]}]
            self._remember(items[-1]["id"], prompt + generated)
        log.debug("%s: %d prompt tokens, %d generated in a batch of %d (%.2f s)", self.name, len(prompt),
                  len(generated), generation.batch_size, generation.seconds)
        return PolicyTurn(items=items, prompt_token_ids=prompt, generation_token_ids=generated,
                          generation_log_probs=log_probs, text=text, input_tokens=len(prompt),
                          output_tokens=len(generated))

    async def generate(self, request: PolicyRequest) -> PolicyTurn:
        """Generate one turn, batched with the turns of concurrent calls; see the module docstring.

        Raises:
            ValueError: The prompt does not fit the model's context, or the history holds an
                item the template cannot render.
            PolicyError: The model failed on this turn's batch, or the policy was closed.
        """
        call = next(self._calls)
        with self._count_lock:
            self._preparing += 1
        try:
            prompt, temperature, top_p, budget = await asyncio.to_thread(self._prepare, request)
        finally:
            with self._count_lock:
                self._preparing -= 1
        seed = None if self.sampling.seed is None else self.sampling.seed + call
        generation = await self._batcher.generate(GenerationRequest(prompt, temperature, top_p, budget, seed))
        return await asyncio.to_thread(self._finish, prompt, generation)

    @property
    def stats(self) -> dict[str, Any]:
        """Counters so far: batches, rows, batch sizes, prompt tokens (computed, from the prefix cache),
        generated tokens, seconds in ``generate``; and the threads generation uses."""
        return {**self._batcher.stats.as_dict(), "threads": self._batcher.num_threads,
                "prefix_cache_mb": round(self._batcher.prefix_cache.nbytes / (1 << 20), 1)}

    def close(self) -> None:
        """Stop the generation worker once the turns already queued have run."""
        self._batcher.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self._batcher.close)

    def _remember(self, item_id: str, tokens: list[int]) -> None:
        self._recent[item_id] = tokens
        while len(self._recent) > _RECENT_TURNS:
            self._recent.popitem(last=False)
