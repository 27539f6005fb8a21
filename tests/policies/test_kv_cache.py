"""PrefixCache: longest prefixes, entries an extension replaces, the byte bound, and discarding an entry."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from nemo_gym_env.policies.kv_cache import PrefixCache  # noqa: E402


def _states(tokens: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """States whose values are the tokens themselves, so a slice shows which positions it holds."""
    column = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1)
    return [(column.clone(), -column.clone()) for _ in range(layers)]


def _bytes(tokens: list[int], layers: int = 2) -> int:
    return 2 * layers * len(tokens) * 4


def test_the_longest_cached_prefix_and_its_positions():
    cache = PrefixCache(max_bytes=1 << 20, min_match=2)
    cache.put([1, 2, 3, 4, 5], _states([1, 2, 3, 4, 5]))
    cache.put([1, 2, 9, 9], _states([1, 2, 9, 9]))
    count, states = cache.longest([1, 2, 3, 4, 7, 8])
    assert count == 4 and states[0][0].flatten().tolist() == [1, 2, 3, 4]
    assert cache.longest([5, 5, 5]) == (0, None)
    assert cache.longest([1]) == (0, None)  # shorter than min_match: not looked up
    assert cache.hits == 1 and cache.reused_tokens == 4


def test_an_extension_replaces_its_prefixes_and_the_bound_drops_the_oldest():
    cache = PrefixCache(max_bytes=_bytes([0] * 10), min_match=1)
    cache.put([1, 2, 3], _states([1, 2, 3]))
    cache.put([1, 2, 3, 4, 5], _states([1, 2, 3, 4, 5]))
    assert len(cache) == 1 and cache.nbytes == _bytes([1, 2, 3, 4, 5])
    cache.put([7, 8, 9, 10], _states([7, 8, 9, 10]))
    cache.put([20, 21, 22], _states([20, 21, 22]))  # 12 tokens in all: the oldest goes
    assert len(cache) == 2 and cache.nbytes == _bytes([0] * 7)
    assert cache.longest([1, 2, 3]) == (0, None)
    assert cache.put(list(range(11)), _states(list(range(11)))) is None  # larger than the whole cache
    assert len(cache) == 2


def test_discard_drops_one_entry_and_its_bytes():
    cache = PrefixCache(max_bytes=1 << 20, min_match=1)
    kept = cache.put([1, 2, 3], _states([1, 2, 3]))
    temporary = cache.put([4, 5], _states([4, 5]))
    assert kept is not None and temporary is not None and kept != temporary
    cache.discard(temporary)
    cache.discard(temporary)  # twice: nothing more happens
    cache.discard(None)
    assert len(cache) == 1 and cache.nbytes == _bytes([1, 2, 3])
    assert cache.longest([4, 5]) == (0, None) and cache.longest([1, 2, 3])[0] == 3
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
