"""Scoring a GRPO group on one pass over its shared prompt.

Every completion of a GRPO group continues the same prompt, and with tool-using tasks the
prompt (system message, worked examples, tool schemas) is most of the sequence: SmolLM2 on
``badge_lookup`` scores 8 completions of about 60 tokens each behind one prompt of 580.
TRL's ``GRPOTrainer`` runs the model over prompt + completion for every row, so the prompt is
computed ``num_generations`` times, forward and backward; on CPU it also projects every
position, prompt included, through the vocabulary-sized LM head (TRL scores only the labelled
positions on Triton devices).

:func:`shared_prompt_logps` packs a group into one sequence instead: the prompt but its last
token once, then one branch per completion (the prompt's last token, then the completion's
tokens), each branch attending to the prompt and to itself only (a 4D attention mask), its
positions continuing the prompt's. One forward pass gives every completion token the hidden
state the unpacked row would give it (the same keys and values in front of it, at the same
relative positions), so the log-probabilities and the gradient are TRL's, up to float rounding
(the tests compare them), for ``(prompt - 1) + sum(completion + 1)`` token positions instead of
``group x (prompt + longest completion)``. The LM head then runs on the labelled positions
only, a few hundred tokens at a time, each chunk recomputed in the backward pass rather than
kept (its logits are the size of the vocabulary per token).

:class:`SharedPromptGRPOTrainer` is ``GRPOTrainer`` with this scoring; anything it does not
cover (vision inputs, MoE auxiliary losses, PEFT models, logit soft-capping or scaling,
attention kernels other than SDPA and eager, prompts that are not left-padded) goes to TRL's
own path unchanged. Scoring whole groups in one pass needs ``per_device_train_batch_size``
to be a multiple of ``num_generations``; with smaller micro-batches a group is split over
several passes, each still sharing its prompt.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from accelerate.utils import is_peft_model
from torch.utils.checkpoint import checkpoint
from trl import GRPOTrainer

__all__ = ["SharedPromptGRPOTrainer", "packable", "shared_prompt_logps"]

LM_HEAD_CHUNK = 256
"""Labelled positions projected through the LM head at once (a chunk's logits: 256 x vocabulary floats)."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                     "logits_scaling")


def packable(model: Any) -> bool:
    """Whether :func:`shared_prompt_logps` can score ``model``: a plain causal LM (its backbone under
    ``base_model_prefix`` and an LM head), attention by SDPA or eager, no transform of the logits."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_output_embeddings"):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text_config is not config:  # a vision-language wrapper: its inputs and backbone differ
        return False
    if any(getattr(text_config, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS):
        return False
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    return isinstance(backbone, torch.nn.Module) and model.get_output_embeddings() is not None


def _chunk_scores(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                  temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    logits = logits.float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    chosen = log_probs.gather(1, labels[:, None]).squeeze(1)
    if not with_entropy:
        return chosen, chosen.new_zeros(())
    return chosen, -(log_probs.exp() * log_probs).sum(-1)


def _head_scores(hidden: torch.Tensor, lm_head: Any, labels: torch.Tensor, temperature: float, with_entropy: bool,
                 fp32_head: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of ``labels`` (and entropies) for ``hidden`` (N, H), chunk by chunk, each chunk's logits
    recomputed in the backward pass instead of kept."""
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    if fp32_head:
        hidden, weight = hidden.float(), weight.float()
        bias = None if bias is None else bias.float()
    scores, entropies = [], []
    for start in range(0, hidden.shape[0], LM_HEAD_CHUNK):
        part = slice(start, start + LM_HEAD_CHUNK)
        args = (hidden[part], weight, bias, labels[part], temperature, with_entropy)
        chosen, entropy = (checkpoint(_chunk_scores, *args, use_reentrant=False) if torch.is_grad_enabled()
                           else _chunk_scores(*args))
        scores.append(chosen)
        entropies.append(entropy)
    if not scores:
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(scores), (torch.cat(entropies) if with_entropy else None)


def _groups(prompts: torch.Tensor, prompt_mask: torch.Tensor, rows_per_pass: int) -> list[tuple[torch.Tensor, list[int]]]:
    """Rows with the same prompt tokens, in order of first appearance, at most ``rows_per_pass`` a group."""
    found: dict[bytes, tuple[torch.Tensor, list[int]]] = {}
    for row in range(prompts.shape[0]):
        tokens = prompts[row][prompt_mask[row].bool()]
        key = tokens.cpu().numpy().tobytes()
        found.setdefault(key, (tokens, []))[1].append(row)
    return [(tokens, rows[start: start + rows_per_pass])
            for tokens, rows in found.values() for start in range(0, len(rows), rows_per_pass)]


def _left_padded(mask: torch.Tensor) -> bool:
    """Every row is zeros then ones (and at least one token)."""
    ones = mask.sum(dim=1)
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] >= (mask.shape[1] - ones)[:, None]
    return bool((ones > 0).all()) and bool((mask.bool() == expected).all())


def _right_padded(mask: torch.Tensor) -> bool:
    """Every row is ones then zeros (an all-zero row included)."""
    ones = mask.sum(dim=1)
    expected = torch.arange(mask.shape[1], device=mask.device)[None, :] < ones[:, None]
    return bool((mask.bool() == expected).all())


def can_pack(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> bool:
    """Whether the batch is TRL's usual layout (left-padded prompts, right-padded completions) of a packable model."""
    width = input_ids.shape[1] - logits_to_keep
    if width < 1 or logits_to_keep < 1 or not packable(model):
        return False
    return _left_padded(attention_mask[:, :width]) and _right_padded(attention_mask[:, width:])


def shared_prompt_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *,
                        temperature: float = 1.0, compute_entropy: bool = False, rows_per_pass: int | None = None,
                        fp32_head: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of the completions, each group scored on one pass.

    Same inputs and outputs as TRL's ``GRPOTrainer._get_per_token_logps_and_entropies``:
    ``input_ids`` is ``(B, P + C)`` (prompts left-padded to ``P``, completions right-padded to
    ``C = logits_to_keep``), ``attention_mask`` the same shape; returns ``(B, C)`` log-probabilities
    of the completion tokens at ``temperature`` (0 where the mask is 0) and, with
    ``compute_entropy``, the entropies at those positions. Call :func:`can_pack` first.

    Args:
        rows_per_pass: At most this many completions share one pass (memory); None: a whole group.
        fp32_head: Project through the LM head in float32 (TRL's ``cast_lm_head_to_fp32``).
    """
    width = input_ids.shape[1] - logits_to_keep
    prompts, completions = input_ids[:, :width], input_ids[:, width:]
    prompt_mask, completion_mask = attention_mask[:, :width], attention_mask[:, width:]
    lengths = completion_mask.sum(dim=1).tolist()
    backbone = getattr(model, model.base_model_prefix)
    lm_head = model.get_output_embeddings()
    eager = model.config._attn_implementation == "eager"
    device = input_ids.device
    logps = torch.zeros(completions.shape, dtype=torch.float32, device=device)
    entropies = torch.zeros(completions.shape, dtype=torch.float32, device=device) if compute_entropy else None
    for prompt, rows in _groups(prompts, prompt_mask, rows_per_pass or input_ids.shape[0]):
        # The packed sequence: prompt[:-1], then per row [prompt[-1], completion...]; branch -1 is the shared part.
        head = prompt[:-1]
        pieces, positions, branches, labels = [head], [torch.arange(len(head), device=device)], \
            [torch.full((len(head),), -1, device=device)], [torch.full((len(head),), -100, device=device)]
        for number, row in enumerate(rows):
            completion = completions[row, : lengths[row]]
            pieces.append(torch.cat([prompt[-1:], completion]))
            positions.append(torch.arange(len(head), len(head) + 1 + len(completion), device=device))
            branches.append(torch.full((1 + len(completion),), number, device=device))
            labels.append(torch.cat([completion, torch.full((1,), -100, device=device)]))
        ids, branch, label = torch.cat(pieces), torch.cat(branches), torch.cat(labels)
        size = len(ids)
        visible = torch.ones((size, size), dtype=torch.bool, device=device).tril()
        visible &= (branch[:, None] == branch[None, :]) | (branch[None, :] == -1)
        mask = visible[None, None]
        if eager:
            mask = torch.zeros(mask.shape, dtype=lm_head.weight.dtype, device=device).masked_fill(
                ~mask, torch.finfo(lm_head.weight.dtype).min)
        hidden = backbone(input_ids=ids[None], attention_mask=mask, position_ids=torch.cat(positions)[None],
                          use_cache=False).last_hidden_state[0]
        scored = label != -100
        with (nullcontext() if not fp32_head else torch.autocast(device.type, enabled=False)):
            chosen, entropy = _head_scores(hidden[scored], lm_head, label[scored], temperature, compute_entropy,
                                           fp32_head)
        # Scatter back: row `number`'s scored positions are its completion tokens, in order.
        owner = branch[scored]
        offset = 0
        for number, row in enumerate(rows):
            count = int((owner == number).sum())
            logps[row, :count] = chosen[offset: offset + count]
            if entropies is not None:
                entropies[row, :count] = entropy[offset: offset + count]
            offset += count
    return logps, entropies


class SharedPromptGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` scoring each group's completions on one pass over their shared prompt.

    Same constructor and behaviour as ``GRPOTrainer``; only the per-token log-probabilities
    (training and any no-grad recomputation) come from :func:`shared_prompt_logps` when the
    batch and model allow it (:func:`can_pack`), else from TRL. Set
    ``per_device_train_batch_size`` to ``num_generations`` (or a multiple) so that a whole
    group shares one pass; turn on activation checkpointing to keep its memory small.
    """

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **inputs):
        unwrapped = self.accelerator.unwrap_model(model)
        if (compute_aux_loss or any(value is not None for value in inputs.values()) or is_peft_model(unwrapped)
                or not can_pack(unwrapped, input_ids, attention_mask, logits_to_keep)):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **inputs)
        with self.accelerator.autocast():
            logps, entropies = shared_prompt_logps(
                unwrapped, input_ids, attention_mask, logits_to_keep, temperature=self.temperature,
                compute_entropy=compute_entropy, rows_per_pass=batch_size,
                fp32_head=bool(getattr(self.args, "cast_lm_head_to_fp32", False)))
        return logps, entropies, None
