"""Continuous batching: rows join and leave a running batch between decoding steps.

:class:`RunningBatch` holds the rows being decoded together and their key/value cache. A new
row arrives prefilled (all of its prompt but the last token, computed alone by
:func:`~nemo_gym_env.policies.kv_cache.prefill`) and joins at the next step; each
:meth:`~RunningBatch.step` feeds every row its last token in one forward pass and picks every
row's next token (:func:`~nemo_gym_env.policies.sampling.choose`); a row that has ended leaves
at once, so its slot serves the next turn instead of idling until the longest row of a fixed
batch is done.

Rows are right-aligned: every row's newest position is the cache's last column; a shorter row
has zero states on its left, masked out by the attention mask, and each row's position ids
are its own. Columns no row uses any more are dropped when rows leave. The cache's buffers grow
by 64 positions at a time and are written in place (:class:`GrowingLayer`): transformers' default cache
concatenates the whole cache on every step, which at 16 rows of 1,000 tokens is most of a
step's memory traffic.

Example (``model`` a causal LM; ``states`` from ``prefill``)::

    batch = RunningBatch(model, end_ids={2})
    batch.add([(Row(key="a", prompt=ids, temperature=0.0, top_p=1.0, budget=32, generator=g), states)])
    while batch.rows:
        batch.step()
        for row in batch.pop_finished():
            row.tokens, row.log_probs
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from nemo_gym_env.policies.kv_cache import States, cache_keyword
from nemo_gym_env.policies.sampling import choose

__all__ = ["GrowingLayer", "Row", "RunningBatch"]

_ROOM = 64


class GrowingLayer(DynamicLayer):
    """A dynamic cache layer whose buffers have room to grow and are written in place (64 more positions when full).

    ``keys``/``values`` are views of the first ``length`` positions, as transformers expects.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.device = keys.device
        self.is_initialized = True
        self.length = keys.shape[2]
        self._keys, self._values = _with_room(keys, self.length), _with_room(values, self.length)
        self._view()

    def _view(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        count = key_states.shape[2]
        if self.length + count > self._keys.shape[2]:
            self._keys = _with_room(self.keys, self.length + count)
            self._values = _with_room(self.values, self.length + count)
        self._keys[:, :, self.length: self.length + count] = key_states
        self._values[:, :, self.length: self.length + count] = value_states
        self.length += count
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def _with_room(tensor: torch.Tensor, needed: int) -> torch.Tensor:
    """``tensor`` (batch, heads, length, dim) copied into a buffer of ``needed`` positions plus 64 more (rows
    join and leave often, and each time the buffers are rebuilt with new room: more would be memory held
    for nothing, a quarter of the batch's states at 256)."""
    out = tensor.new_empty((tensor.shape[0], tensor.shape[1], needed + _ROOM, tensor.shape[3]))
    out[:, :, : tensor.shape[2]] = tensor
    return out


@dataclass(eq=False)
class Row:
    """One turn being decoded: its settings, and what it has produced so far."""

    key: Any
    """The caller's handle (the batcher's job)."""
    prompt: list[int]
    temperature: float
    top_p: float
    budget: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    halted: bool = False
    """Left before its end (its caller went away, or the batch is closing)."""

    @property
    def next_input(self) -> int:
        return self.tokens[-1] if self.tokens else self.prompt[-1]

    @property
    def position(self) -> int:
        return len(self.prompt) - 1 + len(self.tokens)


class RunningBatch:
    """Rows decoded together, joining and leaving between steps (see the module docstring).

    Args:
        model: A causal LM with a plain dynamic cache (:func:`~nemo_gym_env.policies.kv_cache.supports_prefill`).
        end_ids: Tokens that end a row (kept as its last token).
    """

    def __init__(self, model: Any, end_ids: set[int] | frozenset[int]):
        self.model = model
        self.end_ids = frozenset(end_ids)
        self.keyword = cache_keyword(model)
        self.rows: list[Row] = []
        self._layers: list[GrowingLayer] = []
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=model.device)

    @property
    def width(self) -> int:
        """Positions in the cache (the longest row's, padding included)."""
        return self._mask.shape[1]

    def add(self, arrivals: Sequence[tuple[Row, States]]) -> None:
        """Join rows, each with the states of its prompt but the last token (one ``(keys, values)`` per layer)."""
        for row, states in arrivals:
            count = states[0][0].shape[2] if states else 0
            if count != len(row.prompt) - 1:
                raise ValueError(f"states of {count} positions for a prompt of {len(row.prompt)} tokens")
        if not arrivals:
            return
        width = max(self.width, *(len(row.prompt) - 1 for row, _ in arrivals))
        joining = [states or self._empty_states() for _, states in arrivals]  # a one-token prompt: nothing prefilled
        # Layer by layer, each old layer dropped as its successor is built: the batch's states
        # are never held twice (at 16 rows of 1,000 tokens they are hundreds of MB).
        layers: list[Any] = list(self._layers) or [None] * len(joining[0])
        self._layers = []  # only ``layers`` holds them now
        for index in range(len(layers)):
            old, layers[index] = layers[index], None
            keys = [] if old is None else [_left_pad(old.keys, width)]
            values = [] if old is None else [_left_pad(old.values, width)]
            del old
            for states in joining:
                keys.append(_left_pad(states[index][0], width))
                values.append(_left_pad(states[index][1], width))
            layers[index] = GrowingLayer(torch.cat(keys), torch.cat(values))
        self._layers = layers
        masks = [_left_pad_mask(self._mask, width)]
        for row, _ in arrivals:
            mask = torch.zeros((1, width), dtype=torch.long, device=self._mask.device)
            mask[0, width - (len(row.prompt) - 1):] = 1
            masks.append(mask)
            self.rows.append(row)
        self._mask = torch.cat(masks)

    def step(self) -> None:
        """One forward pass over every row's newest token; each row gets its next token and its log-probability."""
        device = self._mask.device
        ids = torch.tensor([[row.next_input] for row in self.rows], dtype=torch.long, device=device)
        positions = torch.tensor([[row.position] for row in self.rows], dtype=torch.long, device=device)
        mask = torch.cat([self._mask, torch.ones((len(self.rows), 1), dtype=torch.long, device=device)], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **{self.keyword: Cache(layers=self._layers)})
        self._mask = mask
        tokens, log_probs = choose(out.logits[:, -1, :], [r.temperature for r in self.rows],
                                   [r.top_p for r in self.rows], [r.generator for r in self.rows])
        for row, token, log_prob in zip(self.rows, tokens, log_probs):
            row.tokens.append(token)
            row.log_probs.append(log_prob)

    def ended(self, row: Row) -> bool:
        """Whether ``row`` has produced an end-of-turn token or its whole budget."""
        return bool(row.tokens) and (row.tokens[-1] in self.end_ids or len(row.tokens) >= row.budget)

    def pop_finished(self, halted: Callable[[Row], bool] = lambda row: False) -> list[Row]:
        """Remove and return the rows that ended, or that ``halted`` says must stop (marked ``halted``)."""
        done = []
        for row in self.rows:
            if self.ended(row):
                done.append(row)
            elif halted(row):
                row.halted = True
                done.append(row)
        if done:
            self.remove(done)
        return done

    def states(self, row: Row) -> States:
        """A copy of ``row``'s states: its prompt and generated tokens but the last one."""
        index = self.rows.index(row)
        count = int(self._mask[index].sum())
        return [(layer.keys[index: index + 1, :, self.width - count:].clone(),
                 layer.values[index: index + 1, :, self.width - count:].clone()) for layer in self._layers]

    def remove(self, rows: Sequence[Row]) -> None:
        """Drop ``rows`` (and the columns no remaining row uses)."""
        gone = {id(r) for r in rows}
        keep = [n for n, row in enumerate(self.rows) if id(row) not in gone]
        self.rows = [self.rows[n] for n in keep]
        if not self.rows:
            self.clear()
            return
        index = torch.tensor(keep, dtype=torch.long, device=self._mask.device)
        mask = self._mask.index_select(0, index)
        used = torch.nonzero(mask.any(dim=0))
        first = int(used[0]) if len(used) else mask.shape[1]
        self._mask = mask[:, first:]
        layers, self._layers = self._layers, []
        for n, layer in enumerate(layers):  # each old layer dropped as its successor is built (see add)
            layers[n] = GrowingLayer(layer.keys.index_select(0, index)[:, :, first:],
                                     layer.values.index_select(0, index)[:, :, first:])
            del layer
        self._layers = layers

    def clear(self) -> None:
        """Drop every row."""
        self.rows = []
        self._layers = []
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self._mask.device)

    def _empty_states(self) -> States:
        config = self.model.config.get_text_config(decoder=True)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        parameter = next(self.model.parameters())
        empty = parameter.new_zeros((1, heads, 0, dim))
        return [(empty, empty) for _ in range(config.num_hidden_layers)]


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """(batch, heads, length, dim) with zero positions on the left up to ``width``."""
    if tensor.shape[2] == width:
        return tensor
    out = tensor.new_zeros((tensor.shape[0], tensor.shape[1], width, tensor.shape[3]))
    out[:, :, width - tensor.shape[2]:] = tensor
    return out


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([mask.new_zeros((mask.shape[0], width - mask.shape[1])), mask], dim=1)
