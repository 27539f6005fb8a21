"""Per-row decoding inside one padded ``model.generate`` call: each row its own temperature, top-p, seed and budget.

A batch of the local model mixes turns of different episodes, so sampling settings cannot be
the batch's. :class:`RowSampler` is a logits processor that picks every row's next token
itself and hands ``generate`` (run greedy, ``do_sample=False``) a one-hot score, so the token
``generate`` appends is always the one chosen here:

- temperature 0: the argmax of the raw logits (greedy);
- temperature > 0: logits divided by the temperature, cut to the top-p nucleus (as
  transformers' ``TopPLogitsWarper`` does), then sampled by the Gumbel-max trick: the argmax
  of the scores plus Gumbel noise drawn from the row's own ``torch.Generator``. That is an
  exact sample of the softmax, and it makes a row's tokens depend on its own seed only, never
  on which other rows share its batch or in what order.

It records the log-probability of each chosen token under the distribution it was chosen from
(the log-softmax of the processed scores; of the raw logits when greedy). :class:`RowBudgets`
stops each row at its own ``max_new_tokens``; ``generate``'s end-of-sequence check stops it at
an end-of-turn token.

Example (``model`` a causal LM, ``ids``/``mask`` a left-padded batch of width ``width``)::

    sampler = RowSampler([0.0, 0.7], [1.0, 0.95], [row_generator(1), row_generator(2)], width)
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=32,
                         logits_processor=LogitsProcessorList([sampler]),
                         stopping_criteria=StoppingCriteriaList([RowBudgets([8, 32], width)]))
    sampler.log_probs()   # (steps, rows)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers.generation import LogitsProcessor, StoppingCriteria

__all__ = ["RowBudgets", "RowSampler", "row_generator"]

_TINY = torch.finfo(torch.float32).tiny


def row_generator(seed: int) -> torch.Generator:
    """A CPU generator for one row's sampling noise."""
    return torch.Generator(device="cpu").manual_seed(int(seed) % (1 << 63))


def top_p_mask(scores: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """True where a token falls outside its row's top-p nucleus (transformers' rule: the smallest set of the
    most likely tokens whose probability reaches ``top_p``, at least one token)."""
    ordered, order = torch.sort(scores, descending=False, dim=-1)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    outside = cumulative <= (1 - top_p)[:, None]
    outside[:, -1] = False
    return outside.scatter(1, order, outside)


class RowSampler(LogitsProcessor):
    """Chooses each row's next token (greedy or sampled, per row) and records its log-probability.

    Args:
        temperatures: Per row; 0 is greedy.
        top_ps: Per row, in (0, 1].
        generators: Per row; the source of that row's sampling noise (unused for greedy rows).
        width: The padded prompt width (the first generated token is at this position).
    """

    def __init__(self, temperatures: Sequence[float], top_ps: Sequence[float],
                 generators: Sequence[torch.Generator], width: int):
        if not len(temperatures) == len(top_ps) == len(generators):
            raise ValueError("temperatures, top_ps and generators need one entry per row")
        self.temperatures = [float(t) for t in temperatures]
        self.top_ps = [float(p) for p in top_ps]
        self.generators = list(generators)
        self.width = width
        self._sampled = [i for i, t in enumerate(self.temperatures) if t > 0]
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.width
        del self._steps[step:]  # a step generate undid and runs again is recorded once
        processed = scores.float()
        chosen = processed.argmax(dim=-1)
        if self._sampled:
            rows = torch.tensor(self._sampled, device=scores.device)
            sub = processed[rows] / torch.tensor([self.temperatures[i] for i in self._sampled],
                                                 device=scores.device)[:, None]
            top_p = torch.tensor([self.top_ps[i] for i in self._sampled], device=scores.device)
            if bool((top_p < 1).any()):
                sub = sub.masked_fill(top_p_mask(sub, top_p), float("-inf"))
            processed = processed.index_copy(0, rows, sub)
            noise = torch.stack([torch.rand(sub.shape[-1], generator=self.generators[i]) for i in self._sampled])
            gumbel = -torch.log(-torch.log(noise.clamp_(min=_TINY, max=1.0 - 1e-7)))
            chosen = chosen.index_copy(0, rows, (sub + gumbel.to(sub.device)).argmax(dim=-1))
        log_probs = torch.log_softmax(processed, dim=-1).gather(1, chosen[:, None]).squeeze(1)
        self._steps.append(log_probs)
        one_hot = torch.full_like(scores, float("-inf"))
        return one_hot.scatter_(1, chosen[:, None], 0.0)

    def log_probs(self) -> torch.Tensor:
        """``(steps, rows)``: the log-probability of each chosen token."""
        if not self._steps:
            return torch.zeros((0, len(self.temperatures)))
        return torch.stack(self._steps).float().cpu()


class RowBudgets(StoppingCriteria):
    """Stops each row once it has generated its own ``max_new_tokens``, or as soon as ``halted()`` says so.

    ``halted`` (optional) returns one flag per row, checked after every step: a row whose caller
    has gone, or every row when the generator is closing.
    """

    def __init__(self, budgets: Sequence[int], width: int, halted: Callable[[], Sequence[bool]] | None = None):
        self.budgets = torch.tensor([int(b) for b in budgets])
        self.width = width
        self.halted = halted

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None = None, **kwargs: object) -> torch.Tensor:
        done = (input_ids.shape[1] - self.width) >= self.budgets
        if self.halted is not None:
            done |= torch.tensor(list(self.halted()), dtype=torch.bool)
        return done.to(input_ids.device)
