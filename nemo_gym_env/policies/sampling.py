"""Per-row decoding: each row of a batch its own temperature, top-p, seed and budget.

A batch of the local model mixes turns of different episodes, so sampling settings cannot be
the batch's. :func:`choose` picks every row's next token:

- temperature 0: the argmax of the raw logits (greedy);
- temperature > 0: logits divided by the temperature, cut to the top-p nucleus (as
  transformers' ``TopPLogitsWarper`` does), then sampled by the Gumbel-max trick: the argmax
  of the scores plus Gumbel noise drawn from the row's own ``torch.Generator``. That is an
  exact sample of the softmax, and it makes a row's tokens depend on its own seed only, never
  on which other rows share its batch or in what order.

It returns the log-probability of each chosen token under the distribution it was chosen from
(the log-softmax of the processed scores; of the raw logits when greedy).

For models decoded as a fixed batch by ``model.generate`` (those whose cache the running batch
cannot rearrange), :class:`RowSampler` does the same as a logits processor (``generate`` runs
greedy and appends the token chosen here) and :class:`RowBudgets` stops each row at its own
``max_new_tokens``.

Example::

    tokens, log_probs = choose(logits, [0.0, 0.7], [1.0, 0.95], [row_generator(1), row_generator(2)])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers.generation import LogitsProcessor, StoppingCriteria

__all__ = ["RowBudgets", "RowSampler", "choose", "choose_tensor", "row_generator", "top_p_mask"]

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


def choose_tensor(logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
                  generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token (``(rows,)``) and its log-probability under the distribution it came from."""
    processed = logits.float()
    chosen = processed.argmax(dim=-1)
    sampled = [i for i, t in enumerate(temperatures) if t > 0]
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        sub = processed[rows] / torch.tensor([float(temperatures[i]) for i in sampled], device=logits.device)[:, None]
        top_p = torch.tensor([float(top_ps[i]) for i in sampled], device=logits.device)
        if bool((top_p < 1).any()):
            sub = sub.masked_fill(top_p_mask(sub, top_p), float("-inf"))
        processed = processed.index_copy(0, rows, sub)
        noise = torch.stack([torch.rand(sub.shape[-1], generator=generators[i]) for i in sampled])
        gumbel = -torch.log(-torch.log(noise.clamp_(min=_TINY, max=1.0 - 1e-7)))
        chosen = chosen.index_copy(0, rows, (sub + gumbel.to(sub.device)).argmax(dim=-1))
    log_probs = torch.log_softmax(processed, dim=-1).gather(1, chosen[:, None]).squeeze(1)
    return chosen, log_probs


def choose(logits: torch.Tensor, temperatures: Sequence[float], top_ps: Sequence[float],
           generators: Sequence[torch.Generator]) -> tuple[list[int], list[float]]:
    """:func:`choose_tensor` as lists: each row's token and its log-probability.

    Example:
        >>> choose(torch.tensor([[0.0, 2.0, 1.0]]), [0.0], [1.0], [row_generator(0)])[0]
        [1]
    """
    chosen, log_probs = choose_tensor(logits, temperatures, top_ps, generators)
    return chosen.tolist(), log_probs.float().tolist()


class RowSampler(LogitsProcessor):
    """:func:`choose_tensor` inside ``model.generate`` (run greedy): it picks each row's token and hands
    ``generate`` a one-hot score, recording the log-probabilities (for models decoded as a fixed batch).

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
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.width
        del self._steps[step:]  # a step generate undid and runs again is recorded once
        chosen, log_probs = choose_tensor(scores, self.temperatures, self.top_ps, self.generators)
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
