"""What a measurement ran on: the CPU's vector and bfloat16 instructions, the load. Standard library only."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["CPU_FLAGS", "cpu_flags", "machine_summary"]

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
"""The instruction-set flags that decide how fast a model's matrix products run on a CPU."""


def cpu_flags() -> list[str]:
    """Which of :data:`CPU_FLAGS` this CPU has (Linux's ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return [flag for flag in CPU_FLAGS if flag in have]
    return []


def machine_summary() -> dict[str, Any]:
    """The 1-minute load average, the CPU count, the architecture and :func:`cpu_flags`, for a results file."""
    return {"load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "machine": platform.machine(),
            "cpu_flags": cpu_flags()}
