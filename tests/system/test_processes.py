"""``system.processes`` in real child processes: the stop signals of the CLI's long-running commands."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from ..conftest import as_a_background_job

CHILD = """
import sys, time
from nemo_gym_env.errors import Stopped
from nemo_gym_env.system.processes import sigterm_raises
try:
    with sigterm_raises():
        print("ready", flush=True)
        time.sleep(60)
except Stopped as exc:
    sys.exit(f"stopped by {exc.signum}")
except KeyboardInterrupt:
    sys.exit("interrupted")
"""


@pytest.mark.parametrize("sig, says", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by 15")])
@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["in-a-terminal", "started-with-sigint-ignored"])
def test_ctrl_c_and_sigterm_stop_the_block_however_the_process_started(sig, says, sigint_ignored):
    command = [sys.executable, "-c", CHILD]
    child = subprocess.Popen(as_a_background_job(command) if sigint_ignored else command, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(sig)
        _, stderr = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 1 and stderr.strip() == says
