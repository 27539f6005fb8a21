"""Handing freed memory back to the system (glibc's allocator; a no-op elsewhere). Standard library only.

A training step allocates and frees hundreds of megabytes of tensors (key/value states while
generating, activations and gradients while training). glibc keeps freed blocks for reuse, in
its heaps and, for blocks under its adaptive mmap threshold (up to 32 MB), in the process's
break; a small model's training process then holds twice what it uses. Measured on the TRL
recipe's step (``benchmarks/grpo_step.py``, variants ``ours`` and ``ours_glibc_defaults``; the
figures are in ``benchmarks/README.md``). ``NEMO_GYM_ENV_MALLOC_DEFAULTS=1`` leaves glibc as it
is (both functions then do nothing), for that comparison.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

__all__ = ["release_large_blocks", "trim"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if os.environ.get("NEMO_GYM_ENV_MALLOC_DEFAULTS") == "1":
        return None
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
