"""The trainer's own generation, one model turn of many episodes at a time.

A rollout asks a :data:`Generate` for the next turn of every live episode;
:func:`trainer_generate` is the trainer's: TRL's vLLM (colocated or a server) when
``use_vllm``; else, in a single process, the training model itself on the package's
continuous-batching engine (:func:`engine_generate`); else the training model with Hugging
Face ``generate``, as TRL's own generation does it. :func:`any_live` keeps the ranks of a
distributed run in step, turn by turn.

Why the engine: the copies of a GRPO group share their whole prompt, and each turn of an
episode extends the previous one. Hugging Face ``generate`` computes every row's whole prompt
on every turn, padding included; the engine (:class:`~nemo_gym_env.policies.batching.BatchGenerator`)
prefills a group's prompt once, continues each episode from its previous turn's key/value
states, and lets rows leave the batch as they end. Its cache is emptied after every rollout
call (the weights change at the next optimizer step). ``benchmarks/grpo_step.py`` measures both.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["EngineGenerate", "Generate", "any_live", "checkpointing", "engine_generate", "eos_ids", "hf_generate",
           "tokenizer_of", "trainer_generate", "vllm_generate"]

Generate = Callable[[list[list[int] | None], list[int]], list[tuple[list[int], list[float | None]] | None]]
"""``generate(prompts, budgets)``: for each prompt (token ids, or None for a row that has
ended), the sampled token ids and their log-probs (None where the prompt was None). May return
more tokens than the row's budget or past an end-of-turn token; the rollout cuts them."""


def tokenizer_of(trainer: Any) -> Any:
    """The trainer's tokenizer (its ``processing_class``, or the tokenizer inside a processor)."""
    processing_class = trainer.processing_class
    return getattr(processing_class, "tokenizer", processing_class)


def eos_ids(trainer: Any, tokenizer: Any) -> list[int]:
    """The end-of-turn token ids: the trainer's, else the tokenizer's EOS."""
    ids = getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id]
    return [int(i) for i in ids if i is not None]


def hf_generate(trainer: Any) -> Generate:
    """Generation with the training model itself (``use_vllm=False``), as TRL's own HF path does it."""
    # trl and transformers take seconds to import and only this path needs them: a rollout driven by
    # vLLM or by another Generate never imports them here.
    from transformers import GenerationConfig
    from trl.models import unwrap_model_for_generation

    args = trainer.args
    tokenizer = tokenizer_of(trainer)
    base = getattr(trainer, "generation_config", None)
    if base is None:
        base = GenerationConfig(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                                eos_token_id=eos_ids(trainer, tokenizer), pad_token_id=tokenizer.pad_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids(trainer, tokenizer)[0]
    device = trainer.accelerator.device

    def generate(prompts: list[list[int] | None], budgets: list[int]) -> list[tuple[list[int], list[float]] | None]:
        live = [i for i, p in enumerate(prompts) if p is not None]
        results: list[tuple[list[int], list[float]] | None] = [None] * len(prompts)
        config = copy.deepcopy(base)
        config.max_new_tokens = max([budgets[i] for i in live], default=1)
        config.output_scores = True
        config.return_dict_in_generate = True
        width = max((len(prompts[i]) for i in live), default=0)
        input_ids = torch.full((len(live), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(live), width), dtype=torch.long)
        for row, i in enumerate(live):
            input_ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            attention[row, width - len(prompts[i]):] = 1
        # Every rank enters the unwrap context on every turn (a collective under DeepSpeed ZeRO-3), even with
        # nothing to generate, so the ranks stay in step.
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator,
            gather_deepspeed3_params=getattr(args, "ds3_gather_for_generation", True),
            generation_kwargs=getattr(trainer, "generation_kwargs", None),
            gradient_checkpointing_kwargs=_checkpointing_kwargs(args),
        ) as model, torch.no_grad():
            if not live:
                return results
            out = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                 generation_config=config)
        sampled = out.sequences[:, width:]
        # Scores are the processed logits (temperature, top-p/top-k applied): log-softmax gives the
        # log-probability under the distribution each token was sampled from.
        logprobs = torch.stack([
            torch.log_softmax(step.float(), dim=-1).gather(1, sampled[:, t:t + 1]).squeeze(1)
            for t, step in enumerate(out.scores)
        ], dim=1) if out.scores else torch.zeros_like(sampled, dtype=torch.float)
        for row, i in enumerate(live):
            results[i] = (sampled[row].tolist(), logprobs[row].tolist())
        return results

    return generate


def vllm_generate(trainer: Any) -> Generate:
    """Generation through TRL's vLLM (colocate or server), one completion per prompt.

    ``trainer.vllm_generation.generate(..., num_generations=1)`` runs token prompts through the
    colocated ``LLM`` or, in server mode, gathers every rank's prompts to the main process, asks
    the vLLM server and scatters the results back. Server mode and colocate with tensor
    parallelism are collectives that slice results by ``len(prompts)``: every rank sends one
    prompt per row, a one-token placeholder for rows that have ended.
    """
    vllm = trainer.vllm_generation
    tokenizer = tokenizer_of(trainer)
    collective = vllm.mode == "server" or getattr(vllm, "tensor_parallel_size", 1) > 1
    placeholder = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos_ids(trainer, tokenizer)[0]]

    def generate(prompts: list[list[int] | None], budgets: list[int]) -> list[tuple[list[int], list[float | None]] | None]:
        sent = list(range(len(prompts))) if collective else [i for i, p in enumerate(prompts) if p is not None]
        results: list[tuple[list[int], list[float | None]] | None] = [None] * len(prompts)
        if not sent:
            return results
        batch = [prompts[i] if prompts[i] is not None else placeholder for i in sent]
        _, completion_ids, logprobs, _ = vllm.generate(prompts=batch, images=None, num_generations=1)
        for n, i in enumerate(sent):
            if prompts[i] is None:
                continue
            ids = list(completion_ids[n])
            lps = [lp[0] for lp in logprobs[n]] if logprobs is not None else [None] * len(ids)
            results[i] = (ids, lps)
        return results

    return generate


class _ClassForward:
    """``model`` called through its class's ``forward``: past the per-instance wrappers the trainer installs
    (accelerate's mixed-precision autocast, TRL's fused LM head), which would cast every weight on every
    decoding step; the engine decodes in the weights' own dtype."""

    def __init__(self, model: Any):
        self._model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return type(self._model).forward(self._model, *args, **kwargs)

    @property
    def forward(self) -> Callable[..., Any]:
        return functools.partial(type(self._model).forward, self._model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class EngineGenerate:
    """A :data:`Generate` on the continuous-batching engine, with the trainer's model (see the module docstring).

    Each call submits every live prompt at once and waits for all of them; rows of a call are
    seeded from the trainer's seed, its global step and the call's count within the step, so a
    run repeats.
    :meth:`release` empties the engine's prefix cache (the rollout calls it when its episodes
    are done: the next optimizer step makes those states stale, and they would only hold memory
    through the backward pass).
    """

    def __init__(self, trainer: Any, engine: Any):
        self.trainer = trainer
        self.engine = engine

    def _next_call(self, step: int) -> int:
        """The count of this step's generation calls so far, this one included (kept on the trainer: each
        rollout builds a new one of these, and two rollouts of one step must not draw the same noise)."""
        last_step, calls = getattr(self.trainer, _CALLS_ATTRIBUTE, (step, 0))
        calls = calls + 1 if last_step == step else 1
        setattr(self.trainer, _CALLS_ATTRIBUTE, (step, calls))
        return calls

    def __call__(self, prompts: list[list[int] | None], budgets: list[int]) -> list[tuple[list[int], list[float]] | None]:
        from nemo_gym_env.policies.batching import GenerationRequest

        args = self.trainer.args
        model = self.engine.model._model
        step = int(getattr(getattr(self.trainer, "state", None), "global_step", 0) or 0)
        calls = self._next_call(step)
        results: list[tuple[list[int], list[float]] | None] = [None] * len(prompts)
        futures: dict[int, concurrent.futures.Future] = {}
        training = model.training
        model.eval()  # no activation checkpointing (and no dropout) while generating
        try:
            for i, prompt in enumerate(prompts):
                if prompt is not None:
                    futures[i] = self.engine.submit(GenerationRequest(
                        prompt=list(prompt), temperature=float(args.temperature), top_p=float(args.top_p),
                        max_new_tokens=int(budgets[i]),
                        seed=hash((int(args.seed), step, calls, i)) & ((1 << 62) - 1)))
            for i, future in futures.items():
                generation = future.result()
                results[i] = (generation.token_ids, generation.log_probs)
        finally:
            # A failed row leaves the others decoding: they end before the model trains or the cache is cleared.
            concurrent.futures.wait(list(futures.values()))
            model.train(training)
        return results

    def release(self) -> None:
        """Drop the cached key/value states (stale once the weights change) and hand their memory back."""
        from nemo_gym_env.system.memory import trim

        self.engine.prefix_cache.clear()
        trim()


_CALLS_ATTRIBUTE = "_nemo_gym_generate_calls"
_ENGINE_ATTRIBUTE = "_nemo_gym_engine"
"""Where a trainer keeps its engine (one per trainer and model: its worker thread and buffers live as long as it)."""


def engine_generate(trainer: Any) -> EngineGenerate | None:
    """The engine's :class:`EngineGenerate` for ``trainer``, or None where it does not apply.

    It applies in a single process without vLLM, for a model whose cache the engine can extend
    (plain attention layers: :func:`~nemo_gym_env.policies.kv_cache.supports_prefill`), with
    sampling the engine does as TRL would (temperature and top-p; no top-k, min-p, repetition
    penalty or extra ``generation_kwargs``).
    """
    from nemo_gym_env.policies.batching import BatchGenerator
    from nemo_gym_env.policies.kv_cache import supports_prefill

    args = trainer.args
    if getattr(trainer, "use_vllm", False) or trainer.accelerator.num_processes > 1:
        return None
    if (args.top_k not in (0, None) or args.min_p is not None or args.repetition_penalty != 1.0
            or getattr(args, "generation_kwargs", None) or not args.temperature or args.temperature <= 0):
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not supports_prefill(model):
        return None
    engine = getattr(trainer, _ENGINE_ATTRIBUTE, None)
    if engine is None or engine.model._model is not model:
        tokenizer = tokenizer_of(trainer)
        eos = eos_ids(trainer, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        engine = BatchGenerator(_ClassForward(model), end_ids=set(eos), pad_id=pad,
                                max_batch_size=max(16, int(getattr(args, "generation_batch_size", 0) or 0)),
                                num_threads=torch.get_num_threads(), name="training model")
        setattr(trainer, _ENGINE_ATTRIBUTE, engine)
    return EngineGenerate(trainer, engine)


def trainer_generate(trainer: Any, *, engine: bool = True) -> Generate:
    """The trainer's own generation: vLLM when ``use_vllm``; else, with ``engine``, the engine with the training
    model (:func:`engine_generate`) where it applies; else the training model with HF ``generate``."""
    if getattr(trainer, "use_vllm", False):
        return vllm_generate(trainer)
    return (engine_generate(trainer) if engine else None) or hf_generate(trainer)


def any_live(trainer: Any) -> Callable[[int], bool]:
    """``any_live(n_local)``: whether any rank still has a live episode (an all-reduce when distributed).

    Called once per turn on every rank, so every rank runs the same number of turns.
    """
    accelerator = trainer.accelerator
    if accelerator.num_processes <= 1:
        return lambda n: n > 0

    def live_on_any_rank(n: int) -> bool:
        counts = accelerator.gather(torch.tensor([n], device=accelerator.device))
        return bool(counts.sum().item() > 0)

    return live_on_any_rank


def _new_checkpointing_name() -> bool:
    """Whether the installed transformers calls it ``activation_checkpointing`` (5.x; the old name warns)."""
    from transformers import TrainingArguments

    return "activation_checkpointing" in getattr(TrainingArguments, "__dataclass_fields__", {})


def checkpointing(enabled: bool = False) -> dict[str, bool]:
    """The config keyword that switches activation (gradient) checkpointing, under the installed name.

    transformers 5.x renamed ``gradient_checkpointing`` to ``activation_checkpointing`` and warns
    (``FutureWarning``) when a config sets only the old one; ``GRPOConfig`` sets the old one to True
    by default, so pass ``**checkpointing(False)`` (or True) to ``GRPOConfig``.

    Example:
        >>> next(iter(checkpointing(False))) in ("activation_checkpointing", "gradient_checkpointing")
        True
    """
    return {"activation_checkpointing" if _new_checkpointing_name() else "gradient_checkpointing": enabled}


def _checkpointing_kwargs(args: Any) -> dict | None:
    """The args' checkpointing keyword arguments, read under the installed name."""
    if hasattr(args, "activation_checkpointing_kwargs"):
        return args.activation_checkpointing_kwargs
    return getattr(args, "gradient_checkpointing_kwargs", None)
