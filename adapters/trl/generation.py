"""The trainer's own generation, one model turn of many episodes at a time.

A rollout asks a :data:`Generate` for the next turn of every live episode;
:func:`trainer_generate` is the trainer's: TRL's vLLM (colocated or a server) when
``use_vllm``, else the training model with Hugging Face ``generate``, as TRL's own generation
does it. :func:`any_live` keeps the ranks of a distributed run in step, turn by turn.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Generate", "any_live", "checkpointing", "eos_ids", "hf_generate", "tokenizer_of", "trainer_generate",
           "vllm_generate"]

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


def trainer_generate(trainer: Any) -> Generate:
    """The trainer's own generation: vLLM when ``use_vllm``, else the training model with HF ``generate``."""
    if getattr(trainer, "use_vllm", False):
        return vllm_generate(trainer)
    return hf_generate(trainer)


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
