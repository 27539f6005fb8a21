"""Handing freed memory back to the system (glibc's allocator; a no-op elsewhere). Standard library only.

A training step allocates and frees hundreds of megabytes of tensors (key/value states while
generating, activations and gradients while training). glibc keeps freed blocks for reuse, in
its heaps and, for blocks under its adaptive mmap threshold (up to 32 MB), in the process's
break; a small model's training process then holds twice what it uses. Measured on the TRL
recipe's quick start (``benchmarks/README.md``): 2.95 GB peak RSS as glibc sets it, 1.93 GB
with :func:`release_large_blocks` at start and :func:`trim` after each rollout and step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_large_blocks", "trim"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def release_large_blocks(threshold: int = 1 << 20) -> bool:
    """Serve every later allocation of ``threshold`` bytes or more from its own mapping, unmapped when freed,
    and return free heap tops over ``threshold`` at once (glibc's ``mallopt``). Process-wide; returns
    whether the allocator took it."""
    libc = _libc()
    if libc is None or threshold < 1:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold))) and bool(libc.mallopt(_M_TRIM_THRESHOLD, int(threshold)))


def trim() -> bool:
    """Return the allocator's free memory to the system now (glibc's ``malloc_trim(0)``); whether any was."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
