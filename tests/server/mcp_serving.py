"""``nemo-gym-env serve ... --mcp`` as a process, for the MCP tests and the docs' examples."""

from __future__ import annotations

import re
import subprocess
import sys
import time

__all__ = ["start_serve", "stop_serve"]


def start_serve(*args: str, timeout_s: float = 300.0, head: bool = False) -> tuple[subprocess.Popen, dict[str, str]]:
    """``nemo-gym-env serve ARGS`` as a process; returns it and the server URLs it printed (with ``head``, the head
    server's too, under ``head_server``)."""
    proc = subprocess.Popen([sys.executable, "-m", "nemo_gym_env.cli", "serve", *args, "+head_server.port=0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    urls: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.match(r"^\s+(\S+)\s+(http://\S+)(\s+\(MCP: (\S+)\))?", line)
        if match and match.group(1) == "head_server" and head:
            urls["head_server"] = match.group(2)
        elif match and match.group(1) != "head_server":
            urls[match.group(1)] = match.group(2)
            if "--mcp" in args:
                assert match.group(4) == match.group(2) + "/mcp"  # --mcp says where
        if line.startswith("Ctrl-C to stop") or time.monotonic() > deadline:
            break
    if proc.poll() is not None or not urls:
        proc.kill()
        raise AssertionError(f"serve did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc, urls


def stop_serve(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it does not stop within a minute."""
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
