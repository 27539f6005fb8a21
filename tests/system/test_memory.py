"""Handing freed memory back to the system: the allocator settings apply in a real process, and an
environment variable leaves glibc as it comes (for the benchmark that compares the two)."""

from __future__ import annotations

import os
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
