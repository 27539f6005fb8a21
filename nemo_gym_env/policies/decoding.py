"""Continuous batching: rows join and leave a running batch between decoding steps.

:class:`RunningBatch` holds the rows being decoded together and their key/value cache. A new
row arrives prefilled (all of its prompt but the last token, computed alone by
:func:`~nemo_gym_env.policies.kv_cache.prefill`) and joins at the next step; each
:meth:`~RunningBatch.step` feeds every row its last token in one forward pass and picks every
row's next token (:func:`~nemo_gym_env.policies.sampling.choose`); a row that has ended leaves
at once, so its slot serves the next turn instead of idling until the longest row of a fixed
batch is done.

A greedy row may also be fed draft tokens (:mod:`~nemo_gym_env.policies.drafts`, ``drafts``): the
step then feeds every row the same number of positions (a row without drafts is padded with its
newest token), each position seeing the ones before it; a row takes the drafts the model chose
itself, plus the model's token after the last of them, and the columns of its rejected drafts stay
masked out (its states, handed back when it ends, leave them out). Drafts shrink as rows grow
(``draft_positions``, 16: 4 drafts a row for 1-3 rows, 3 for 4, 2 for 5, 1 for 6-16, none past 16): a
step of a few rows costs the reading of every weight whatever it computes; a larger one costs its
computation too. And a step feeds drafts only where the tokens they are expected to save (each
row's own record of kept drafts this turn) outweigh what the extra positions cost every row, as
the batch has timed its own steps of as many rows with and without drafts (timed again every 32 steps
where it has stopped drafting, so that a slow spell does not end drafting for the batch's life).

Rows are kept in groups of similar length (up to 4). Within a group rows are right-aligned:
every row's newest position is the group's last column; a shorter row has zero states on its
left, masked out, and each row's position ids are its own. One padded block for every row would
pad each to the longest: in the README's main job 16 rows held 11,100 positions of states in
24,500. A step is one forward pass over every row; the attention runs once per group
(:class:`~nemo_gym_env.policies.attention.GroupedStates`), and a joining or leaving row rebuilds
its own group only. Columns no row of a group uses any more are dropped when rows leave. The
buffers grow by 64 positions at a time and are written in place (:class:`GrowingLayer`):
transformers' default cache concatenates the whole cache on every step, which at 16 rows of
1,000 tokens is most of a step's memory traffic. A model without the package's CPU attention
(:func:`~nemo_gym_env.policies.attention.use_decode_attention`: another device, another
implementation), or of a type other than Llama, Qwen2 and Qwen3, keeps one group and
transformers' own masks.

Example (``model`` a causal LM; ``states`` from ``prefill``)::

    batch = RunningBatch(model, end_ids={2})
    batch.add([(Row(key="a", prompt=ids, temperature=0.0, top_p=1.0, budget=32, generator=g), states)])
    while batch.rows:
        batch.step()
        for row in batch.pop_finished():
            row.tokens, row.log_probs
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from nemo_gym_env.policies.attention import NAME as ATTENTION_NAME
from nemo_gym_env.policies.attention import GroupedStates, group_mask
from nemo_gym_env.policies.drafts import Lookup, accepted
from nemo_gym_env.policies.kv_cache import States, cache_keyword
from nemo_gym_env.policies.sampling import choose

__all__ = ["GrowingLayer", "Row", "RunningBatch"]

_ROOM = 64
_POSITION_COST, _MOST_POSITION_COST = 0.04, 0.3
"""Until a batch has timed its own steps: what feeding each row one more position costs a step, as a fraction of a
one-token step of as many rows: 0.04 times the rows, at most 0.3. SmolLM2-135M, bfloat16, 2 cores: a row alone
decodes 1 or 5 positions in 37 ms; 8 rows 1 or 2 positions each in 63 or 80 ms (0.27); 16 rows in 80 or 104 ms
(0.3). In float32 a second position costs 0.48 of a step at 1 row and 16 alike; in int8, 0.11 at 1 row."""
_SMOOTHING = 0.3
"""Weight of a step's newest time in the running average of its kind's (rows, positions a row); a time over twice the
average counts as twice it (a step slowed by another thread of the process, or by a shape run for the first time)."""
_PROBE_EVERY = 32
"""Steps of as many rows without drafts after which one is fed a draft a row anyway (where it has drafts), its time
replacing every drafted kind's of as many rows: the time of drafted steps, which decides whether to draft, is measured
again rather than kept from a slow spell."""
_NEW_GROUP = 128
"""Padding positions (a row's, or a group's rows' together) that make a joining row start a group of its own."""
_GROUPED_TYPES = frozenset({"llama", "qwen2", "qwen3"})
"""Model types whose attention passes the cache's keys and values straight to the attention function, with no
sliding window or soft cap: their running batch may hold several groups. Others keep one."""


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

    @property
    def capacity(self) -> int:
        """Positions the buffers hold, written or not."""
        return self._keys.shape[2]

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers (their positions past ``length`` are zeros)."""
        return self._keys, self._values


def _with_room(tensor: torch.Tensor, needed: int) -> torch.Tensor:
    """``tensor`` (batch, heads, length, dim) copied into a buffer of ``needed`` positions plus 64 more (rows
    join and leave often, and each time the buffers are rebuilt with new room: more would be memory held
    for nothing, a quarter of the batch's states at 256)."""
    out = tensor.new_empty((tensor.shape[0], tensor.shape[1], needed + _ROOM, tensor.shape[3]))
    out[:, :, : tensor.shape[2]] = tensor
    out[:, :, tensor.shape[2]:] = 0  # attention may read the room (masked): it must hold numbers
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
    lookup: Lookup | None = None
    """The n-gram index of its prompt and tokens, built at its first drafted step (greedy rows only)."""
    drafted: int = 0
    kept: int = 0
    """Its draft tokens fed and kept so far."""

    @property
    def next_input(self) -> int:
        return self.tokens[-1] if self.tokens else self.prompt[-1]

    @property
    def position(self) -> int:
        return len(self.prompt) - 1 + len(self.tokens)


class _Group:
    """Rows of similar length decoded together: one :class:`GrowingLayer` per model layer, right-aligned, and
    their (rows, width) mask (1 where a position is the row's, 0 for its left padding)."""

    def __init__(self, device: torch.device):
        self.rows: list[Row] = []
        self.layers: list[GrowingLayer] = []
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def join(self, arrivals: Sequence[tuple[Row, States]]) -> None:
        """Take ``arrivals`` (each row with the states of all its positions but the newest), rebuilding the buffers at
        the new width."""
        lengths = [states[0][0].shape[2] for _, states in arrivals]
        width = max(self.width, *lengths)
        # Layer by layer, each old layer dropped as its successor is built: the group's states
        # are never held twice (at 16 rows of 1,000 tokens they are hundreds of MB).
        layers: list[Any] = list(self.layers) or [None] * len(arrivals[0][1])
        self.layers = []  # only ``layers`` holds them now
        for index in range(len(layers)):
            old, layers[index] = layers[index], None
            keys = [] if old is None else [_left_pad(old.keys, width)]
            values = [] if old is None else [_left_pad(old.values, width)]
            del old
            for _, states in arrivals:
                keys.append(_left_pad(states[index][0], width))
                values.append(_left_pad(states[index][1], width))
            layers[index] = GrowingLayer(torch.cat(keys), torch.cat(values))
        self.layers = layers
        masks = [_left_pad_mask(self.mask, width)]
        for (row, _), length in zip(arrivals, lengths):
            mask = torch.zeros((1, width), dtype=torch.long, device=self.mask.device)
            mask[0, width - length:] = 1
            masks.append(mask)
            self.rows.append(row)
        self.mask = torch.cat(masks)

    def keep(self, keep: list[int]) -> None:
        """Keep the rows at ``keep`` (and the columns they use)."""
        self.rows = [self.rows[n] for n in keep]
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        used = torch.nonzero(mask.any(dim=0))
        first = int(used[0]) if len(used) else mask.shape[1]
        self.mask = mask[:, first:]
        layers, self.layers = self.layers, []
        for n, layer in enumerate(layers):  # each old layer dropped as its successor is built (see join)
            layers[n] = GrowingLayer(layer.keys.index_select(0, index)[:, :, first:],
                                     layer.values.index_select(0, index)[:, :, first:])
            del layer
        self.layers = layers

    def states(self, index: int) -> States:
        columns = torch.nonzero(self.mask[index]).squeeze(1)
        count = len(columns)
        if not count or int(columns[0]) == self.width - count:  # no rejected drafts between its columns
            return [(layer.keys[index: index + 1, :, self.width - count:].clone(),
                     layer.values[index: index + 1, :, self.width - count:].clone()) for layer in self.layers]
        return [(layer.keys[index: index + 1].index_select(2, columns),
                 layer.values[index: index + 1].index_select(2, columns)) for layer in self.layers]


class _StepLayer(DynamicLayer):
    """One model layer of a grouped step (see :class:`RunningBatch`): ``update`` writes each group's new key/value
    states into that group's buffers and returns them all as a :class:`GroupedStates` for the attention."""

    def __init__(self, groups: list[_Group], index: int, masks: list[torch.Tensor],
                 shared: dict[tuple[int, int], tuple[bool, torch.Tensor | None]], dtype: torch.dtype, queries: int):
        super().__init__()
        self.is_initialized = True
        self._groups, self._index, self._masks, self._shared, self._dtype = groups, index, masks, shared, dtype
        self._queries = queries
        self._length = max(group.width for group in groups)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[GroupedStates, GroupedStates]:
        parts, first = [], 0
        for number, (group, mask) in enumerate(zip(self._groups, self._masks)):
            end = first + len(group.rows)
            layer = group.layers[self._index]
            keys, values = layer.update(key_states[first:end], value_states[first:end])
            capacity = layer.capacity
            if (number, capacity) not in self._shared:  # every layer of a group has the same buffers' size
                self._shared[number, capacity] = group_mask(mask, capacity, self._dtype, self._queries)
            whole, attend_mask = self._shared[number, capacity]
            if whole:
                keys, values = layer.buffers
            parts.append((first, end, keys, values, attend_mask))
            first = end
        self._length += key_states.shape[2]
        states = GroupedStates(parts)
        return states, states

    def get_seq_length(self) -> int:
        return self._length


class RunningBatch:
    """Rows decoded together, joining and leaving between steps (see the module docstring).

    Rows are kept in up to ``max_groups`` groups of similar length, each padded to its own longest row;
    a step is one forward pass over every row, with one attention call per group
    (:class:`~nemo_gym_env.policies.attention.GroupedStates`). A model without that attention (another
    device, another attention implementation) or of another type (``_GROUPED_TYPES``) keeps one group, padded
    to the longest row.

    Args:
        model: A causal LM with a plain dynamic cache (:func:`~nemo_gym_env.policies.kv_cache.supports_prefill`).
        end_ids: Tokens that end a row (kept as its last token).
        max_groups: Groups of rows at most.
        drafts: Draft tokens a greedy row may be fed with its newest token in a step of a grouped model
            (:mod:`~nemo_gym_env.policies.drafts`); 0 feeds one token a row.
        draft_positions: Positions a drafted step feeds over all its rows before its drafts shrink to one a row
            (16: 4 drafts for 1-3 rows, 3 for 4, 2 for 5, 1 for 6-16); a step of more rows than this drafts none.
    """

    def __init__(self, model: Any, end_ids: set[int] | frozenset[int], *, max_groups: int = 4, drafts: int = 0,
                 draft_positions: int = 16):
        if max_groups < 1:
            raise ValueError(f"max_groups must be >= 1, got {max_groups}")
        if drafts < 0 or draft_positions < 1:
            raise ValueError(f"drafts must be >= 0 and draft_positions >= 1, got {drafts} and {draft_positions}")
        self.model = model
        self.end_ids = frozenset(end_ids)
        self.max_groups = max_groups
        self.drafts = drafts
        self.draft_positions = draft_positions
        self.drafted = 0
        """Draft tokens fed so far."""
        self.accepted = 0
        """Draft tokens kept so far (each a token decoded without a step of its own)."""
        self.keyword = cache_keyword(model)
        self._groups: list[_Group] = []
        self._seconds: dict[tuple[int, int], float] = {}  # (rows, drafts fed a row): a step's time, averaged
        self._undrafted: dict[int, int] = {}  # rows: steps of that many rows since the last drafted one
        self._timed_model: Any = None

    @property
    def rows(self) -> list[Row]:
        """Every row, in the order of the step's inputs (group by group)."""
        return [row for group in self._groups for row in group.rows]

    @property
    def groups(self) -> list[tuple[int, int]]:
        """Each group's rows and width."""
        return [(len(group.rows), group.width) for group in self._groups]

    @property
    def positions(self) -> tuple[int, int]:
        """(positions the rows hold, positions the buffers hold including padding)."""
        return (sum(int(group.mask.sum()) for group in self._groups),
                sum(len(group.rows) * group.width for group in self._groups))

    @staticmethod
    def _grouped(model: Any) -> bool:
        """Whether ``model``'s steps take groups: it runs the package's CPU attention, and its attention layers
        hand the cache's states to the attention function unchanged (the model types of ``_GROUPED_TYPES``)."""
        config = getattr(model, "config", None)
        return (getattr(config, "_attn_implementation", None) == ATTENTION_NAME
                and getattr(config, "model_type", None) in _GROUPED_TYPES)

    def add(self, arrivals: Sequence[tuple[Row, States]]) -> None:
        """Join rows, each with the states of its prompt but the last token (one ``(keys, values)`` per layer)."""
        for row, states in arrivals:
            count = states[0][0].shape[2] if states else 0
            if count != len(row.prompt) - 1:
                raise ValueError(f"states of {count} positions for a prompt of {len(row.prompt)} tokens")
        if not arrivals:
            return
        limit = self.max_groups if self._grouped(self.model) else 1
        # Where each arrival goes, longest first: the group it pads least, or a group of its own when every
        # group would pad it, or be padded, by more than _NEW_GROUP positions and there is room for one.
        groups = list(self._groups)  # with the new ones, which join the batch once they hold their rows
        planned = {id(group): (len(group.rows), group.width) for group in groups}
        joining: dict[int, list[tuple[Row, States]]] = {}
        for row, states in sorted(arrivals, key=lambda arrival: -len(arrival[0].prompt)):
            length = len(row.prompt) - 1
            best, best_pad = None, None
            for group in groups:
                count, width = planned[id(group)]
                pad = (count + 1) * max(width, length) - count * width - length
                if best_pad is None or pad < best_pad:
                    best, best_pad = group, pad
            if best is None or (best_pad > _NEW_GROUP and len(groups) < limit):
                best = _Group(self.model.device)
                groups.append(best)
                planned[id(best)] = (0, 0)
            count, width = planned[id(best)]
            planned[id(best)] = (count + 1, max(width, length))
            joining.setdefault(id(best), []).append((row, states or self._empty_states()))
        for group in groups:
            if id(group) in joining:
                group.join(joining[id(group)])
                if group not in self._groups:
                    self._groups.append(group)

    def step(self) -> None:
        """One forward pass over every row's newest token (and a greedy row's drafts); each row gets its next
        token, or several where its drafts were the model's own choices, with their log-probabilities."""
        model = self.model  # once: another thread may replace the model meanwhile
        grouped = self._grouped(model)
        if len(self._groups) > 1 and not grouped:
            self._merge()  # the model was switched to an attention without groups
        rows = self.rows
        started = time.perf_counter()
        if model is not self._timed_model:  # another model: its steps take other times
            self._seconds, self._timed_model = {}, model
        drafts = self._draft(rows) if grouped else [[] for _ in rows]
        queries = 1 + max(map(len, drafts))
        device = self._groups[0].mask.device
        ids = torch.tensor([[row.next_input, *draft, *[row.next_input] * (queries - 1 - len(draft))]
                            for row, draft in zip(rows, drafts)], dtype=torch.long, device=device)
        positions = torch.tensor([row.position for row in rows], dtype=torch.long, device=device)[:, None] + \
            torch.arange(queries, device=device)
        masks = [torch.cat([group.mask, torch.ones((len(group.rows), queries), dtype=torch.long, device=device)], dim=1)
                 for group in self._groups]
        if grouped:
            dtype, shared = self._groups[0].layers[0].keys.dtype, {}
            layers = [_StepLayer(self._groups, index, masks, shared, dtype, queries)
                      for index in range(len(self._groups[0].layers))]
            out = model(input_ids=ids, position_ids=positions, use_cache=True, **{self.keyword: Cache(layers=layers)})
        else:
            out = model(input_ids=ids, attention_mask=masks[0], position_ids=positions, use_cache=True,
                        **{self.keyword: Cache(layers=self._groups[0].layers)})
        logits = out.logits[:, -queries:, :]
        tokens, log_probs = choose(logits[:, 0], [r.temperature for r in rows],
                                   [r.top_p for r in rows], [r.generator for r in rows])
        taken = [[token] for token in tokens]
        taken_log_probs = [[log_prob] for log_prob in log_probs]
        if queries > 1:
            chosen = logits[:, 1:].argmax(dim=-1).tolist()
            for n, (row, draft) in enumerate(zip(rows, drafts)):
                kept = accepted(draft, [tokens[n], *chosen[n]])
                row.drafted, row.kept = row.drafted + len(draft), row.kept + kept
                self.drafted, self.accepted = self.drafted + len(draft), self.accepted + kept
                taken[n] += chosen[n][:kept]
            # The log-probabilities of the tokens after kept drafts: chosen greedily, as at a row's first position.
            extra = [(n, j) for n, row_taken in enumerate(taken) for j in range(1, len(row_taken))]
            if extra:
                index = torch.tensor(extra, device=device)
                _, values = choose(logits[index[:, 0], index[:, 1]], [0.0] * len(extra), [1.0] * len(extra),
                                   [rows[n].generator for n, _ in extra])
                for (n, _), value in zip(extra, values):
                    taken_log_probs[n].append(value)
        kept_columns = []
        for row, row_taken, row_log_probs in zip(rows, taken, taken_log_probs):
            count = 0
            for token, token_log_prob in zip(row_taken, row_log_probs):
                row.tokens.append(token)
                row.log_probs.append(token_log_prob)
                count += 1
                if self.ended(row):
                    break
            if row.lookup is not None:
                row.lookup.extend(row.tokens[-count:])
            kept_columns.append(count)
        first = 0
        for group, mask in zip(self._groups, masks):
            if queries > 1:  # the columns of a row's rejected drafts (and of its filler) are masked from now on
                kept = torch.tensor(kept_columns[first: first + len(group.rows)], device=device)
                mask[:, -queries:] = (torch.arange(queries, device=device)[None, :] < kept[:, None]).long()
            first += len(group.rows)
            group.mask = mask
        seconds, key = time.perf_counter() - started, (len(rows), queries - 1)
        if queries > 1 and self._undrafted.get(len(rows), 0) >= _PROBE_EVERY:  # a probe: drafted steps timed afresh
            self._seconds = {kind: value for kind, value in self._seconds.items() if kind[0] != len(rows) or not kind[1]}
        average = self._seconds.get(key)
        self._seconds[key] = seconds if average is None else average + _SMOOTHING * (min(seconds, 2 * average) - average)
        self._undrafted[len(rows)] = 0 if queries > 1 else self._undrafted.get(len(rows), 0) + 1

    def _cost(self, rows: int, fed: int) -> float:
        """What feeding each of ``rows`` rows ``fed`` more positions costs a step, as a fraction of a one-token step
        of as many rows: measured on this batch's own steps where it has timed both kinds, else estimated
        (``_POSITION_COST``)."""
        plain, drafted = self._seconds.get((rows, 0)), self._seconds.get((rows, fed))
        if plain and drafted:
            return max(0.0, drafted / plain - 1)
        return min(_MOST_POSITION_COST, _POSITION_COST * rows) * fed

    def _draft(self, rows: list[Row]) -> list[list[int]]:
        """Each row's draft tokens for this step (greedy rows only, within ``drafts`` and ``draft_positions``).

        A step feeds every row as many positions as its longest draft, so drafts cost every row. A row's drafts
        are kept with a chance estimated from its own turn so far (its kept over its fed drafts, from an even
        prior), and the step feeds the number of positions with the most tokens expected per unit of its cost
        (:meth:`_cost`, timed on the batch's own steps): a row whose drafts keep failing (prose that does not
        repeat itself) stops costing the others, and a row alone, whose step in bfloat16 costs about the same for
        1 or 5 positions, drafts unless its drafts nearly always fail."""
        if (self.drafts < 1 or len(rows) > self.draft_positions
                or ((len(rows), 0) not in self._seconds and any(key[0] == len(rows) for key in self._seconds))):
            return [[] for _ in rows]  # (the last: a drafted step of these rows was timed, a plain one not yet)
        count = min(self.drafts, max(1, self.draft_positions // len(rows) - 1))
        proposals: list[tuple[list[int], float]] = []
        for row in rows:
            room = min(count, row.budget - len(row.tokens) - 1)
            if row.temperature > 0 or room < 1:
                proposals.append(([], 0.0))
                continue
            if row.lookup is None:
                row.lookup = Lookup(row.prompt + row.tokens)
            proposals.append((row.lookup.drafts(room), (row.kept + 1) / (row.drafted + 2)))
        best, best_rate = 0, 1.0
        for fed in range(1, max(len(draft) for draft, _ in proposals) + 1):
            expected = sum(chance ** n for draft, chance in proposals for n in range(1, min(len(draft), fed) + 1))
            rate = (len(rows) + expected) / (len(rows) * (1 + self._cost(len(rows), fed)))
            if rate > best_rate:
                best, best_rate = fed, rate
        if not best and self._undrafted.get(len(rows), 0) >= _PROBE_EVERY and any(draft for draft, _ in proposals):
            best = 1  # measure drafted steps again (_PROBE_EVERY)
        return [draft[:best] for draft, _ in proposals]

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
        for group in self._groups:
            for index, member in enumerate(group.rows):
                if member is row:
                    return group.states(index)
        raise ValueError("the row is not in this batch")

    def remove(self, rows: Sequence[Row]) -> None:
        """Drop ``rows`` (and the columns no remaining row of their group uses)."""
        gone = {id(r) for r in rows}
        for group in list(self._groups):
            keep = [n for n, row in enumerate(group.rows) if id(row) not in gone]
            if not keep:
                self._groups.remove(group)
            elif len(keep) < len(group.rows):
                group.keep(keep)

    def clear(self) -> None:
        """Drop every row."""
        self._groups = []

    def _merge(self) -> None:
        """One group of every row (each group's rows join the first, one at a time)."""
        first, *others = self._groups
        for group in others:
            arrivals = [(row, group.states(index)) for index, row in enumerate(group.rows)]
            self._groups.remove(group)
            first.join(arrivals)

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
