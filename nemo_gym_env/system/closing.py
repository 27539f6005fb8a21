"""``Closing``: the context manager of every object that owns something to give back with ``close()``.

A launcher's processes, a rollouts file, a server set, a trainer's rollout function: each is used as
``with X(...) as x:`` and stopped by ``close()``, which must be safe to call twice.
"""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """A context manager whose exit calls :meth:`close` (a subclass defines it; it must be idempotent)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
