"""Key/value states of the local model: each prompt prefilled on its own, finished turns reused.

Multi-turn prompts grow by extension (docs/architecture.md, "The wire": each call's prompt
starts with every token seen so far), so most of a turn's prompt was already computed by the
previous turn of the same episode, and concurrent rollouts of one task share their whole first
prompt. :class:`PrefixCache` keeps the key/value states of recently finished sequences (prompt
plus generated tokens, bounded in bytes, least recently used dropped first) and hands out the
longest cached prefix of a new prompt; :func:`prefill` computes the rest of the prompt on top
of it, batch of one: no padding is computed, and the numbers are the ones a lone prompt gets.

Only models whose cache is a plain dynamic cache (every layer attends to the whole context) take
this path (:func:`supports_prefill`); the others are generated as fixed batches
(:mod:`~nemo_gym_env.policies.fixed_batch`).

States are ``[(keys, values), ...]``, one pair per layer, each ``(1, heads, tokens, head_dim)``.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

__all__ = ["PrefixCache", "States", "cache_keyword", "prefill", "supports_prefill"]

States = list[tuple[torch.Tensor, torch.Tensor]]


def supports_prefill(model: Any) -> bool:
    """Whether ``model``'s cache is made of plain dynamic layers (no sliding window, no linear attention)."""
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # noqa: BLE001 - a model whose cache cannot be built this way takes the padded path
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def cache_keyword(model: Any) -> str:
    """The name ``forward`` and ``generate`` take the cache under (``cache``; ``past_key_values`` before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _layers(cache: Any) -> States:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _dynamic(states: States) -> DynamicCache:
    cache = DynamicCache()
    for index, (keys, values) in enumerate(states):
        cache.update(keys, values, index)
    return cache


def prefill(model: Any, tokens: Sequence[int], cached: States | None, keyword: str) -> States:
    """States of ``tokens``, computing only those after the ``cached`` prefix (whose states it extends)."""
    done = cached[0][0].shape[2] if cached else 0
    if done >= len(tokens):
        return [(k[:, :, : len(tokens)], v[:, :, : len(tokens)]) for k, v in cached] if cached else []
    cache = _dynamic(cached) if cached else DynamicCache()
    ids = torch.tensor([list(tokens[done:])], dtype=torch.long, device=model.device)
    model(input_ids=ids, use_cache=True, logits_to_keep=1, **{keyword: cache})
    return _layers(cache)


def _nbytes(states: States) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in states)


class PrefixCache:
    """Finished sequences' states by their tokens, for prompts that start with them (LRU, bounded in bytes).

    Args:
        max_bytes: Total size of the states kept; 0 keeps nothing.
        min_match: Shorter common prefixes are not worth a lookup's copy and are ignored.

    Example::

        cache = PrefixCache(max_bytes=1 << 30)
        count, states = cache.longest(prompt)      # (0, None) on a miss
        cache.put(prompt + generated[:-1], states_of_those_tokens)
    """

    def __init__(self, max_bytes: int, *, min_match: int = 16):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.min_match = min_match
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0
        self._entries: OrderedDict[int, tuple[torch.Tensor, States, int]] = OrderedDict()
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, tokens: Sequence[int]) -> tuple[int, States | None]:
        """The longest cached prefix of ``tokens``: its length and its states (views), or ``(0, None)``."""
        if not self._entries or len(tokens) < self.min_match:
            return 0, None
        wanted = torch.tensor(list(tokens), dtype=torch.int64)
        best, best_key = 0, None
        for key, (have, _, _) in self._entries.items():
            common = min(len(have), len(wanted))
            if common <= best:
                continue
            same = have[:common] == wanted[:common]
            count = common if bool(same.all()) else int(same.int().argmin())
            if count > best:
                best, best_key = count, key
        if best_key is None or best < self.min_match:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.reused_tokens += best
        states = self._entries[best_key][1]
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in states]

    def clear(self) -> None:
        """Drop every entry (the model's weights changed: the states no longer hold)."""
        self._entries.clear()
        self.nbytes = 0

    def put(self, tokens: Sequence[int], states: States) -> int | None:
        """Keep ``states`` (one per token of ``tokens``), dropping entries it extends and the least recently used;
        the entry's key (for :meth:`discard`), or None if it was not kept."""
        size = _nbytes(states)
        if not tokens or size > self.max_bytes:
            return None
        have = torch.tensor(list(tokens), dtype=torch.int64)
        for key, (old, _, old_size) in list(self._entries.items()):
            if len(old) <= len(have) and bool((have[: len(old)] == old).all()):
                del self._entries[key]  # a prefix of the new entry: the new one serves it too
                self.nbytes -= old_size
        key = self._next
        self._entries[key] = (have, states, size)
        self._next += 1
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, (_, _, dropped) = self._entries.popitem(last=False)
            self.nbytes -= dropped
        return key if key in self._entries else None

    def discard(self, key: int | None) -> None:
        """Drop the entry ``put`` returned ``key`` for, if it is still there."""
        entry = self._entries.pop(key, None) if key is not None else None
        if entry is not None:
            self.nbytes -= entry[2]
