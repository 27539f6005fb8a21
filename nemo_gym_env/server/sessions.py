"""A bounded, expiring store of per-session server state."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar

V = TypeVar("V")

__all__ = ["SessionStore"]

class SessionStore(MutableMapping[str, V], Generic[V]):
    """Session id -> state, bounded by a count cap and an idle time-to-live.

    Entries are kept in least-recently-used order, so expiry and eviction only ever look at
    the front: every operation is amortised O(1). A server holding 16k live episodes with a
    cap of 100k never grows past the cap, and sessions abandoned without ``/verify`` go after
    ``ttl_s`` seconds without use.

    Example:
        >>> store = SessionStore(max_sessions=2, ttl_s=60)
        >>> store["a"] = 1; store["b"] = 2; store["c"] = 3
        >>> sorted(store)
        ['b', 'c']
        >>> store.evicted
        1
    """

    def __init__(self, max_sessions: int = 100_000, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic,
                 on_drop: Callable[[V], None] | None = None):
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock
        self._on_drop = on_drop  # called with the state of a session evicted by the cap or expired (not deleted)
        self._data: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self.evicted = 0
        self.expired = 0

    def _expire(self, now: float) -> None:
        cutoff = now - self.ttl_s
        while self._data:
            key, (touched, _) = next(iter(self._data.items()))
            if touched >= cutoff:
                break
            _, value = self._data.pop(key)
            self.expired += 1
            self._dropped(value)

    def __getitem__(self, key: str) -> V:
        now = self._clock()
        self._expire(now)
        _, value = self._data[key]
        self._data[key] = (now, value)
        self._data.move_to_end(key)
        return value

    def __setitem__(self, key: str, value: V) -> None:
        now = self._clock()
        self._expire(now)
        self._data[key] = (now, value)
        self._data.move_to_end(key)
        while len(self._data) > self.max_sessions:
            _, (_, dropped) = self._data.popitem(last=False)
            self.evicted += 1
            self._dropped(dropped)

    def _dropped(self, value: V) -> None:
        if self._on_drop is not None:
            self._on_drop(value)

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        self._expire(self._clock())
        return iter(list(self._data))

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        self._expire(self._clock())
        return key in self._data

    def get_or_create(self, key: str, factory: Callable[[], V]) -> V:
        """Return the state of ``key``, creating it with ``factory()`` when absent."""
        try:
            return self[key]
        except KeyError:
            value = factory()
            self[key] = value
            return value

    def stats(self) -> dict[str, Any]:
        """Counts for monitoring: live sessions, evictions by cap, expiries by TTL."""
        return {"live": len(self), "evicted": self.evicted, "expired": self.expired, "max_sessions": self.max_sessions}
