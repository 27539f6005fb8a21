"""docs/scale_out.md's cluster section, run as written on a fresh two-node cluster with token authentication.

The commands are read from the page (the blocks marked ``<!-- run: NAME -->``) and run by bash,
each "machine" in a home folder of its own (the head's token file is not on the other node). This
machine stands in for both: the head's address becomes 127.0.0.2, port 6379 a free port, 16 CPUs 2,
and a ``ray`` on the PATH before the real one adds to ``ray start`` only what keeps the test's
nodes apart from any other Ray here (``--block`` in a session of its own, a temporary folder, a
loopback address: 127.0.0.2 for the head, 127.0.0.3 for the other); every other ``ray`` command goes
to Ray unchanged. Then what the page says about
a missing token is checked: ``ray status`` and ``connect()`` fail at once, naming it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .cluster import REPO, descendants
from .sockets import PeerWatch, connect_log_env, connected, outside_loopback, process_tree

pytestmark = pytest.mark.slow

DOC = REPO / "docs" / "scale_out.md"
BLOCK = re.compile(r"<!-- run: (?P<name>[\w.-]+) -->\n```\w*\n(?P<body>.*?)\n```", re.DOTALL)

SHIM = r"""#!/usr/bin/env bash
# `ray start` for a test: blocking, in a session of its own, isolated; any other `ray` command unchanged.
if [ "$1" != start ]; then exec "$RAY_PYTHON" -m ray.scripts.scripts "$@"; fi
shift
extra=(--block --temp-dir="$RAY_TEST_TMP/r$$" --disable-usage-stats)
case " $* " in *" --head "*) extra+=(--include-dashboard=false --node-ip-address=127.0.0.2) ;;
  *) extra+=(--node-ip-address=127.0.0.3) ;; esac
for attempt in 1 2 3; do
  log="$RAY_TEST_TMP/node$$-$attempt.log"
  setsid "$RAY_PYTHON" -m ray.scripts.scripts start "$@" "${extra[@]}" >"$log" 2>&1 </dev/null &
  pid=$!
  echo $pid >>"$RAY_TEST_TMP/nodes"
  for _ in $(seq 1 600); do  # as a plain `ray start` does: return once the node is up, fail if it fails
    grep -q "Ray runtime started" "$log" && exit 0
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  kill -0 $pid 2>/dev/null && { echo "ray start: not up after 300 s" >&2; exit 1; }
  # Ray gives a node 30 s to register, which a loaded machine can miss: only then, start it again.
  grep -q "timed out during startup" "$log" || break
  echo "ray start: the node timed out registering; starting it again" >&2
  sleep 2
done
cat "$log" >&2
exit 1
"""


def _blocks() -> dict[str, str]:
    found = {m["name"]: m["body"] for m in BLOCK.finditer(DOC.read_text())}
    assert {"head", "node", "status", "script", "smoke_test.py", "one-start", "one-script", "one-stop"} <= set(found)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_here(text: str, port: int, token: str = "") -> str:
    return (text.replace("10.0.0.1", "127.0.0.2").replace("6379", str(port)).replace("--num-cpus=16", "--num-cpus=2")
            .replace("<token>", token))


def _machine(root: Path, name: str) -> dict[str, str]:
    """A clean environment for one machine: its own home, no Ray settings of this test process."""
    home = root / name
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTHONPATH"))}
    path = os.pathsep.join((str(root / "bin"), str(Path(sys.executable).parent), env["PATH"]))  # `python`: this one
    return {**env, "HOME": str(home), "PATH": path, "RAY_PYTHON": sys.executable,
            "RAY_TEST_TMP": str(root), "RAY_USAGE_STATS_ENABLED": "0"}


def _smoke_tasks() -> int:
    """The tasks of the server smoke_test.py plays (each played twice)."""
    return sum(1 for line in (REPO / "servers/example_single_tool_call/data/example.jsonl").read_text().splitlines()
               if line.strip())


def _bash(script: str, env: dict[str, str], cwd: Path, timeout_s: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def test_the_cluster_section_works_as_written_auth_included() -> None:
    blocks = _blocks()
    root = Path(tempfile.mkdtemp(prefix="ngdoc", dir="/tmp"))  # short: Ray's socket paths are limited
    (root / "bin").mkdir()
    shim = root / "bin" / "ray"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    port = _free_port()
    try:
        head = _bash(_as_here(blocks["head"], port), _machine(root, "head"), root)
        assert head.returncode == 0, head.stderr[-3000:]
        token = head.stdout.strip().splitlines()[-1]
        assert re.fullmatch(r"[0-9a-f]{32,}", token), head.stdout
        assert (root / "head" / ".ray" / "auth_token").read_text().strip() == token

        node = _bash(_as_here(blocks["node"], port, token), _machine(root, "node"), root)
        assert node.returncode == 0, node.stderr[-3000:]
        assert not (root / "node" / ".ray" / "auth_token").exists()  # it joined with the variable alone

        # `ray status` reads the autoscaler's view, which takes a few seconds to list a node that joined.
        deadline, client = time.monotonic() + 60, _machine(root, "client")
        while True:
            status = _bash(_as_here(blocks["status"], port, token), client, root)
            assert status.returncode == 0, status.stderr[-3000:]
            if "4.0 CPU" in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert "4.0 CPU" in status.stdout or "0.0/4.0 CPU" in status.stdout, status.stdout
        assert len(re.findall(r"^\s*1 node_", status.stdout, re.MULTILINE)) == 2, status.stdout  # both nodes active

        script = _machine(root, "script")
        (root / "smoke_test.py").write_text(_as_here(blocks["smoke_test.py"], port))
        ran = _bash(_as_here(blocks["script"], port, token), script, root, timeout_s=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert f"{2 * _smoke_tasks()} rollouts, mean reward 1.00" in ran.stdout, ran.stdout + ran.stderr[-2000:]

        # What the page says of a missing token: ray status and connect() say so at once.
        address = f"127.0.0.2:{port}"
        bare = _machine(root, "bare")
        refused = _bash(f"ray status --address={address}", bare, root)
        assert refused.returncode != 0 and "InvalidAuthToken" in refused.stderr, refused.stderr[-2000:]
        probe = "from nemo_gym_env.ray_cluster import connect; import sys; connect(sys.argv[1])"
        refusal = f"ClusterConnectionError: the Ray cluster at {address} requires token authentication and "
        for extra, says in (({}, refusal + "this process has no RAY_AUTH_MODE set"),
                            ({"RAY_AUTH_MODE": "token"},  # said before Ray is asked: Ray would abort the process
                             (f"ClusterConnectionError: cannot join the Ray cluster at {address}: this process has "
                              "RAY_AUTH_MODE=token but no token")),
                            ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "f" * len(token)},
                             refusal + "the token this process has is not the cluster's")):
            started = time.monotonic()
            failed = subprocess.run([sys.executable, "-c", probe, address], env={**bare, **extra},
                                    capture_output=True, text=True, timeout=120, check=False)
            assert failed.returncode != 0
            assert says in failed.stderr, failed.stderr[-2000:]
            assert "RAY_AUTH_TOKEN=<token>" in failed.stderr and "Failed to connect" not in failed.stderr
            assert time.monotonic() - started < 60  # not Ray's 20-second retry loop before a bare message
        # A server that reserves its verifiers on the cluster (math) says it at start, in one line.
        served = subprocess.run([sys.executable, "-m", "nemo_gym_env.cli", "serve", "math", "+head_server.port=0",
                                 f"+ray_head_node_address={address}"], env=bare, capture_output=True, text=True,
                                timeout=240, check=False)
        assert served.returncode == 1 and "Traceback" not in served.stderr, served.stderr[-3000:]
        said = [line for line in served.stderr.splitlines() if "did not start" in line]
        assert len(said) == 1 and (f"did not start: math verifier: the Ray cluster at {address} requires token "
                                   "authentication and this process has no RAY_AUTH_MODE set") in said[0], served.stderr
        nobody = subprocess.run([sys.executable, "-c", probe, f"127.0.0.1:{_free_port()}"], env=bare,
                                capture_output=True, text=True, timeout=120, check=False)
        assert "ClusterConnectionError: nothing answers at the Ray cluster address" in nobody.stderr, nobody.stderr
    finally:
        _stop_nodes(root)


def _stop_nodes(root: Path) -> None:
    """Stop the nodes this test started (their sessions and what they started), nothing else; remove its files."""
    pids = [int(p) for p in (root / "nodes").read_text().split()] if (root / "nodes").exists() else []
    tree = [child for pid in pids for child in descendants(pid)]
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)  # `ray start --block` stops its node
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in [*pids, *tree]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def test_the_one_machine_steps_keep_to_loopback_and_to_themselves() -> None:
    """The "One machine" blocks as written, in one shell, the cluster's processes watched from before its start:
    every connection of theirs on 127.0.0.0/8 (sampled, and each Python process's own record of its connects
    and name lookups), no token in ~/.ray, and after the stop block nothing left that carries the cluster's folder.
    """
    blocks = _blocks()
    root = Path(tempfile.mkdtemp(prefix="ngone", dir="/tmp"))
    port = str(_free_port())
    (root / "smoke_test.py").write_text(blocks["smoke_test.py"])
    env = {**_machine(root, "home"), "NEMO_GYM_ENV_CACHE": str(root / "cache"), **connect_log_env(root / "connect")}
    home = Path(env["HOME"])
    # The doc's blocks as written, in one shell; the test adds only the lines that print what it checks.
    script = "\n".join([blocks["one-start"].replace("6379", port), 'echo "folder=$RAY_ONE"',
                        blocks["one-script"].replace("6379", port),
                        'echo "stopping=$(date +%s.%N)"', blocks["one-stop"], 'echo "stopped=$(date +%s.%N)"'])
    shell = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], env=env, cwd=root, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        with PeerWatch(lambda: process_tree([shell.pid])) as watch:
            out, err = shell.communicate(timeout=600)
        assert shell.returncode == 0, out[-2000:] + err[-3000:]
        said = dict(line.split("=", 1) for line in out.splitlines() if re.match(r"^(folder|stopping|stopped)=", line))
        assert f"{2 * _smoke_tasks()} rollouts, mean reward 1.00" in out, out + err[-2000:]
        assert watch.outside_loopback() == {}
        assert watch.samples >= 10 and any(peer.startswith("127.0.0.2:") for peer in watch.peers), sorted(watch.peers)
        logged = connected(root / "connect")
        assert any(peer.startswith("127.0.0.") for peer in logged), logged
        assert outside_loopback(logged) == {}
        assert not (home / ".ray").exists()  # the token stayed in the cluster's folder
        assert float(said["stopped"]) - float(said["stopping"]) < 20  # not the 30 s drain of a group SIGTERM
        folder = said["folder"]
        assert not Path(folder).exists()
        assert _carrying(folder) == [], _carrying(folder)  # `ps` finds nothing of it
    finally:
        if shell.poll() is None:
            shell.kill()
        for pid in _carrying(str(root)):  # every process of the cluster has the connect log's folder in its environment
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def _carrying(text: str) -> list[int]:
    """The live processes whose command line or environment holds ``text``."""
    found = []
    needle = text.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                seen = handle.read()
            with open(f"/proc/{entry}/environ", "rb") as handle:
                seen += handle.read()
        except OSError:
            continue
        if needle in seen:
            found.append(int(entry))
    return found
