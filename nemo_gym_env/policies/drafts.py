"""Draft tokens for greedy rows, from the row's own context (prompt-lookup decoding).

An agent's turn repeats much of what it has read: a tool's name and its argument names from the
tool list, an id from the task, a phrase of its own earlier turn. :class:`Lookup` keeps an index
of the n-grams of a row's context (prompt and generated tokens); when the context ends with an
n-gram seen before (3 tokens, else 2, else 1), it proposes the tokens that followed its latest
earlier occurrence as drafts. The running batch
(:class:`~nemo_gym_env.policies.decoding.RunningBatch`) feeds a row its newest token and its
drafts in one forward pass and keeps the drafts the model would have chosen itself
(:func:`accepted`): a greedy row's tokens are the ones it decodes one at a time, several per
step where the drafts hold. A step of a few rows reads every weight once, whether it computes one
position a row or four, so kept drafts cost little; the batch feeds drafts only where they are
expected to pay (``benchmarks/README.md``, "Draft tokens").

Example::

    lookup = Lookup([5, 6, 7, 8, 5, 6])
    lookup.drafts(3)   # [7, 8, 5]: what followed "5 6" the last time
    lookup.extend([7])
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Lookup", "accepted"]

_SIZES = (3, 2, 1)
"""n-gram sizes looked up, longest first."""


class Lookup:
    """An n-gram index over a growing token sequence: where each n-gram last ended before the newest token."""

    __slots__ = ("_ends", "tokens")

    def __init__(self, tokens: Sequence[int]):
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the sequence."""
        for token in tokens:
            self.tokens.append(int(token))
            # An n-gram is indexed once a token follows it (the newest token has no continuation yet).
            end = len(self.tokens) - 1
            for size in _SIZES:
                if end >= size:
                    self._ends[tuple(self.tokens[end - size: end])] = end

    def drafts(self, count: int) -> list[int]:
        """Up to ``count`` tokens that followed the latest earlier occurrence of the sequence's last n-gram."""
        if count < 1:
            return []
        tokens = self.tokens
        for size in _SIZES:
            if len(tokens) > size:
                end = self._ends.get(tuple(tokens[-size:]))
                if end is not None:
                    return tokens[end: end + count]
        return []


def accepted(drafts: Sequence[int], chosen: Sequence[int]) -> int:
    """How many leading ``drafts`` match ``chosen`` (the model's greedy token at each fed position): the tokens a
    row takes from a step are ``chosen[: accepted + 1]``."""
    count = 0
    for draft, token in zip(drafts, chosen):
        if draft != token:
            break
        count += 1
    return count

