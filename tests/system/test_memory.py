"""Handing freed memory back to the system: the allocator settings apply in a real process, an
environment variable leaves glibc as it comes (for the benchmark that compares the two), and a
trim gives freed heap pages back."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

PROBE = ("from nemo_gym_env.system import memory; "
         "print(memory.release_large_blocks(), memory.release_large_blocks(0))")


def _probe(**env: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, check=True)
    return done.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_takes_the_settings_and_a_threshold_below_one_is_refused():
    assert _probe() == ["True", "False"]


def test_the_environment_variable_leaves_the_allocator_alone():
    assert _probe(NEMO_GYM_ENV_MALLOC_DEFAULTS="1") == ["False", "False"]


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's malloc_trim and /proc")
def test_trim_hands_freed_heap_pages_back():
    from nemo_gym_env.system.memory import trim

    blocks = [bytearray(4000) for _ in range(50_000)]  # 200 MB from malloc's heap (each above pymalloc's limit)
    pin = bytearray(4000)  # allocated after them: the freed space is not at the heap's top, so free() keeps it
    held = _rss_mib()
    del blocks
    freed_but_kept = _rss_mib()
    trim()
    released = _rss_mib()
    assert held - freed_but_kept < 50, (held, freed_but_kept)  # free() alone gave little back
    assert freed_but_kept - released > 150, (freed_but_kept, released)
    del pin
