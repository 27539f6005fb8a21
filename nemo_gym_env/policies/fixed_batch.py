"""A fixed batch through ``model.generate``: for models whose cache the running batch cannot rearrange.

Models with sliding-window or linear-attention layers keep caches that
:class:`~nemo_gym_env.policies.decoding.RunningBatch` does not assemble. Their turns are
generated as fixed batches instead: the prompts left-padded with an attention mask, one
``model.generate`` run greedy, with :class:`~nemo_gym_env.policies.sampling.RowSampler` choosing
each row's token (its own temperature, top-p and seed) and
:class:`~nemo_gym_env.policies.sampling.RowBudgets` stopping each row at its own budget; each row
is then cut at its first end-of-turn token (kept). The batch lasts as long as its longest row.

Example::

    results = generate_fixed(model, [(prompt, 0.0, 1.0, 64, row_generator(0))], end_ids={2}, pad_id=2)
    tokens, log_probs = results[0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation import LogitsProcessorList, StoppingCriteriaList

from nemo_gym_env.policies.sampling import RowBudgets, RowSampler

__all__ = ["generate_fixed"]


def generate_fixed(model: Any, rows: Sequence[tuple[list[int], float, float, int, torch.Generator]], *,
                   end_ids: frozenset[int] | set[int], pad_id: int,
                   halted: Callable[[], Sequence[bool]] | None = None) -> list[tuple[list[int], list[float]]]:
    """Generate ``rows`` (``(prompt, temperature, top_p, max_new_tokens, generator)``) as one padded batch.

    ``halted`` (optional) returns one flag per row after each step; a flagged row stops there.
    Returns each row's tokens and their log-probabilities.
    """
    width = max(len(prompt) for prompt, *_ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for n, (prompt, *_) in enumerate(rows):
        ids[n, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[n, width - len(prompt):] = 1
    sampler = RowSampler([r[1] for r in rows], [r[2] for r in rows], [r[4] for r in rows], width)
    budgets = [r[3] for r in rows]
    config = GenerationConfig(max_new_tokens=max(budgets), do_sample=False, eos_token_id=sorted(end_ids),
                              pad_token_id=pad_id)
    with torch.inference_mode():
        out = model.generate(ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config,
                             logits_processor=LogitsProcessorList([sampler]),
                             stopping_criteria=StoppingCriteriaList([RowBudgets(budgets, width, halted)]))
    sequences = getattr(out, "sequences", out)
    generated = sequences[:, width:].cpu().tolist()
    log_probs = sampler.log_probs().T.tolist()
    results = []
    for n, budget in enumerate(budgets):
        tokens = generated[n][:budget]
        end = next((i for i, token in enumerate(tokens) if token in end_ids), None)
        if end is not None:
            tokens = tokens[: end + 1]
        results.append((tokens, log_probs[n][: len(tokens)]))
    return results
