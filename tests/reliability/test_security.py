"""Security (docs/architecture.md: "The wire", "Reliability and security"): sessions, secrets, bind addresses, the code sandbox.

- A forged cookie, or one replayed from another server (same class, another launch; another
  class), reaches no session state; session ids are random uuid4s.
- Canary secrets (``policy_api_key``, the math judge's ``judge_api_key``) passed through
  ``nemo-gym-env config``, ``serve`` (head server, logs, a judge that echoes the key back) and
  ``rollouts`` (an endpoint that echoes the key back) appear in no output, file, log, HTTP
  reply or error message; a server whose config rejects the key does not quote it.
- Servers bind 127.0.0.1 by default and warn loudly when bound elsewhere.
- The code sandbox resists the escapes its own tests do not try (the launched server's
  environment holds the session secret; /proc tricks; another run's scratch directory;
  thread, descriptor, mmap and disk bombs; ignoring the CPU-limit signal).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import itsdangerous
import pytest

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.errors import ServerCrashed
from nemo_gym_env.launch.catalog import bundled_spec
from nemo_gym_env.launch.config import load_config
from nemo_gym_env.launch.head_server import HeadServer
from nemo_gym_env.launch.launcher import Launcher
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server import SESSION_SECRET_ENV, BaseResourcesServerConfig

from ..cli.conftest import CLI, cli_env, read_jsonl, run_cli
from ..conftest import example_rows
from ..fixtures import fixture_specs
from ..fixtures.openai_server import running_server
from .conftest import with_config

pytestmark = pytest.mark.slow

COUNTER = "example_session_state_mgmt"


# ---- sessions -----------------------------------------------------------------------------------


def _cookie(response: httpx.Response) -> tuple[str, str]:
    name, _, value = response.headers["set-cookie"].split(";", 1)[0].partition("=")
    return name, value


def _session_id(value: str) -> str:
    """The session id inside a cookie: signed, not encrypted, so anyone holding it can read it."""
    payload = value.split(".", 1)[0]
    return json.loads(base64.b64decode(payload + "=" * (-len(payload) % 4)))["session_id"]


def _forge(session_id: str, secret: str) -> str:
    payload = base64.b64encode(json.dumps({"session_id": session_id}).encode())
    return itsdangerous.TimestampSigner(secret).sign(payload).decode()


def _count(url: str, name: str, value: str) -> int | None:
    """The counter a cookie reaches; None when the server refuses the cookie (410: not its session)."""
    reply = httpx.post(f"{url}/get_counter_value", json={}, cookies={name: value}, timeout=10, trust_env=False)
    if reply.status_code == 410:
        assert "set-cookie" not in reply.headers  # no new session handed to the holder of a bad cookie
        return None
    assert reply.status_code == 200, reply.text
    return reply.json()["count"]


def test_forged_and_replayed_cookies_reach_no_state(figures):
    row = example_rows(COUNTER)[0]
    with Launcher(ready_timeout_s=60) as first, Launcher(ready_timeout_s=60) as second:
        a = first.start(bundled_spec(COUNTER))
        b = second.start(bundled_spec(COUNTER))  # same class and instance name, another launch
        c = first.start(fixture_specs("reliability")["rel_load"])  # another class (a subclass, even)
        seed = httpx.post(f"{a.url}/seed_session", json={**row, "initial_count": 7}, timeout=10, trust_env=False)
        name, victim = _cookie(seed)
        httpx.post(f"{a.url}/increment_counter", json={"count": 5}, cookies={name: victim}, timeout=10, trust_env=False)
        assert _count(a.url, name, victim) == 12
        victim_id = _session_id(victim)

        other_launch = _cookie(httpx.post(f"{b.url}/seed_session", json={**row, "initial_count": 1000}, timeout=10))
        other_class = _cookie(httpx.post(f"{c.url}/seed_session", json={**row, "initial_count": 1000}, timeout=10))
        assert other_launch[0] == name and other_class[0] != name
        attacks = {
            "cookie of the same server class from another launch": other_launch[1],
            "cookie of another server class, renamed": other_class[1],
            "victim's id signed with NeMo Gym's derived secret (the cookie name)": _forge(victim_id, name),
            "victim's id signed with the class name": _forge(victim_id, "StatefulCounterResourcesServer"),
            "victim's id signed with an empty secret": _forge(victim_id, ""),
            "victim's id signed with a random secret": _forge(victim_id, secrets.token_urlsafe(32)),
            "victim's cookie with its signature tampered": victim[:-4] + ("AAAA" if not victim.endswith("AAAA") else "BBBB"),
            "victim's cookie with another payload, same signature": base64.b64encode(
                json.dumps({"session_id": str(uuid.uuid4())}).encode()).decode() + "." + victim.split(".", 1)[1],
        }
        reached, refused = {}, {}
        for what, value in attacks.items():
            count = _count(a.url, name, value)
            write = httpx.post(f"{a.url}/increment_counter", json={"count": 1000}, cookies={name: value}, timeout=10)
            reached[what] = count is not None or write.status_code != 410
            refused[what] = count is None and write.status_code == 410
        # The genuine cookie replayed on the other launch reaches nothing there either.
        assert _count(b.url, name, victim) is None
        assert _count(b.url, name, other_launch[1]) == 1000
        assert _count(a.url, name, victim) == 12, "an attacker changed the victim's counter"
        verify_body = {**row, "initial_count": 7, "expected_count": 12,
                       "response": make_response([]).model_dump(mode="json", exclude_none=True)}
        forged_verify = httpx.post(f"{a.url}/verify", json=verify_body, cookies={name: _forge(victim_id, name)},
                                   timeout=10)
        assert forged_verify.status_code == 410, forged_verify.text
        assert httpx.post(f"{a.url}/verify", json=verify_body, cookies={name: victim}, timeout=10).json()["reward"] == 1.0
    assert not any(reached.values()), [k for k, v in reached.items() if v]
    assert all(refused.values())
    figures.record("attacks tried (each: read, then write the counter)", len(attacks) + 1)
    figures.record("attacks that reached the victim's state", sum(reached.values()))
    figures.record("attacks refused with 410 (no new session opened)", sum(refused.values()) + 1)


def test_session_ids_are_random_uuid4(figures):
    n = 1000
    with Launcher(ready_timeout_s=60) as launcher:
        proc = launcher.start(bundled_spec(COUNTER))
        row = example_rows(COUNTER)[0]
        client = ResourcesClient(proc.url, timeout_s=60)

        async def seed_all() -> list[str]:
            jars: list[dict[str, str]] = [{} for _ in range(n)]
            await asyncio.gather(*(client.seed_session(row, jar) for jar in jars))
            return [_session_id(next(iter(jar.values()))) for jar in jars]

        ids = background_loop().run(seed_all())
        environ_a = Path(f"/proc/{proc.pid}/environ").read_bytes()
        other = Launcher(ready_timeout_s=60)
        try:
            environ_b = Path(f"/proc/{other.start(bundled_spec(COUNTER)).pid}/environ").read_bytes()
        finally:
            other.close()
    parsed = [uuid.UUID(i) for i in ids]
    assert len(set(ids)) == n
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in parsed)
    # The 122 random bits: each one set in about half the ids (5 sigma), and no id close to another.
    random_bits = [b for b in range(128) if b not in (48, 49, 50, 51, 64, 65)]  # version and variant
    ones = [sum((u.int >> (127 - b)) & 1 for u in parsed) for b in random_bits]
    sigma = (n * 0.25) ** 0.5
    worst = max(abs(c - n / 2) / sigma for c in ones)
    assert worst < 5, f"a bit of the session ids is biased ({worst:.1f} sigma)"
    nearest = min(bin(a.int ^ b.int).count("1") for a, b in zip(parsed, parsed[1:]))
    assert nearest > 30

    def secret(environ: bytes) -> str:
        return dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)[SESSION_SECRET_ENV.encode()].decode()

    assert secret(environ_a) != secret(environ_b) and len(secret(environ_a)) >= 43  # 32 random bytes
    figures.record("session ids sampled", n)
    figures.record("distinct / uuid4 with RFC 4122 variant", f"{len(set(ids))} / {n}")
    figures.record("most biased of the 122 random bits", round(worst, 2), "sigma")
    figures.record("fewest differing bits between consecutive ids", nearest)
    figures.record("signing secret", "32 random bytes per launch (differs between launches)")


# ---- secrets ------------------------------------------------------------------------------------


def _canary(kind: str) -> str:
    return f"CANARY-{kind}-{secrets.token_hex(6)}"


def _no_canary(where: str, text: str, *canaries: str) -> None:
    for canary in canaries:
        assert canary not in text, f"{canary} leaked into {where}"


@pytest.fixture(scope="module")
def endpoint() -> Any:
    """A fake OpenAI-compatible endpoint; model ``echo-key-*`` answers 401 repeating the bearer token."""
    with running_server() as url:
        yield url


def test_canary_secrets_appear_in_no_output_log_reply_or_error(tmp_path, endpoint, figures):
    policy_key, judge_key = _canary("policy"), _canary("judge")
    judge = [f"++math.resources_servers.math.judge_api_key={judge_key}",
             f"++math.resources_servers.math.judge_base_url={endpoint}",
             "++math.resources_servers.math.judge_model=echo-key-judge"]
    overrides = [f"+policy_api_key={policy_key}", *judge]
    (tmp_path / "env.yaml").write_text(f"policy_api_key: {policy_key}\npolicy_base_url: {endpoint}\n")
    checked = []

    # 1. config: the merged config, and an error about a malformed secret override.
    shown = run_cli("config", "example_single_tool_call", "math", *overrides, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "***REDACTED***" in shown.stdout and "judge_base_url" in shown.stdout
    _no_canary("`config` output", shown.stdout + shown.stderr, policy_key, judge_key)
    bad = run_cli("config", "math", f"+policy_api_key={policy_key},x", cwd=tmp_path)
    assert bad.returncode != 0 and "policy_api_key" in bad.stderr
    _no_canary("a config error message", bad.stdout + bad.stderr, policy_key)
    checked += ["config stdout", "config error"]

    # 2. serve: head server routes, a judge that echoes the key, logs.
    logs = tmp_path / "logs"
    proc = subprocess.Popen([*CLI, "serve", "example_single_tool_call", "math", *overrides, "+head_server.port=0",
                             "--log-dir", str(logs)], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        urls = {}
        deadline = time.monotonic() + 120
        while "head_server" not in urls and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            match = re.match(r"^\s+(\S+)\s+(http://\S+)", line)
            if match:
                urls[match.group(1)] = match.group(2)
        assert "head_server" in urls, proc.stderr.read() if proc.poll() is not None else "serve did not start"
        head = urls["head_server"]
        served = "".join(httpx.get(f"{head}{route}", timeout=10).text
                         for route in ("/", "/global_config_dict_yaml", "/servers", "/server_instances"))
        assert "judge_api_key" in served and "math" in served
        _no_canary("the head server's replies", served, policy_key, judge_key)
        row = example_rows("math")[0]
        wrong = {"type": "message", "role": "assistant", "id": "m", "status": "completed",
                 "content": [{"type": "output_text", "text": "\\boxed{-12345}", "annotations": []}]}
        body = {**row, "response": make_response([wrong]).model_dump(mode="json", exclude_none=True)}
        verified = httpx.post(f"{urls['math']}/verify", json=body, timeout=120)
        assert verified.status_code == 200
        reply = verified.json()
        assert reply["reward"] == 0.0 and "401" in (reply.get("judge_error") or ""), reply.get("judge_error")
        assert "***" in reply["judge_error"]  # the judge echoed the key; it was redacted
        _no_canary("the math /verify reply (judge error)", verified.text, judge_key)
        bad_body = httpx.post(f"{urls['math']}/verify", content=b"{not json", timeout=30,
                              headers={"content-type": "application/json"})
        assert bad_body.status_code == 422
        _no_canary("a 422 error", bad_body.text, policy_key, judge_key)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    _no_canary("serve stdout/stderr", out + err, policy_key, judge_key)
    log_text = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    assert "math judge failed" in log_text  # the judge failure was logged...
    _no_canary("the server logs", log_text, policy_key, judge_key)  # ...without the key
    checked += ["head server: /, /global_config_dict_yaml, /servers, /server_instances",
                "math /verify reply with the judge's echo", "serve stdout/stderr", "server log files"]

    # 3. rollouts: an endpoint that echoes the key in its error, over two servers (one with the judge).
    out_path = tmp_path / "results" / "rollouts.jsonl"
    result = run_cli("rollouts", "example_single_tool_call", "math", *overrides, "--policy", "openai", "--model",
                     "echo-key-policy", "--limit", "2", "-o", str(out_path), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    failures = read_jsonl(out_path.with_name("rollouts_failures.jsonl"))
    assert failures and all("401" in f["failure_reason"] for f in failures)
    written = "".join(p.read_text() for p in out_path.parent.iterdir())
    _no_canary("rollouts output, failures and metrics files", written, policy_key, judge_key)
    _no_canary("rollouts stdout/stderr", result.stdout + result.stderr, policy_key, judge_key)
    checked += ["rollouts stdout/stderr", "rollouts output/failures/metrics files"]
    figures.record("canaries", "policy_api_key (command line and env.yaml), math judge_api_key")
    figures.record("places checked, canary found in", f"{len(checked)}, 0")
    figures.record("places", checked)


def test_a_server_config_error_does_not_quote_the_key(tmp_path, caplog):
    key = _canary("config")  # 25 characters: the fixture wants 32+, so its config is refused
    spec = with_config(fixture_specs("reliability")["rel_secret"], api_key=key)
    with Launcher(ready_timeout_s=60, log_dir=tmp_path) as launcher, pytest.raises(ServerCrashed) as crash:
        launcher.start(spec)
    message = str(crash.value)
    assert "api_key" in message and "at least 32" in message  # the error still says what is wrong...
    _no_canary("the start-up error", message, key)  # ...without the key
    _no_canary("the server log", (tmp_path / "rel_secret.log").read_text(), key)
    _no_canary("the launcher's log records", caplog.text, key)


# ---- bind addresses ---------------------------------------------------------------------------------


def _listening(port: int) -> set[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_servers_bind_loopback_by_default_and_warn_loudly_elsewhere(tmp_path, caplog, figures):
    assert BaseResourcesServerConfig().host == "127.0.0.1"
    with Launcher(ready_timeout_s=60, log_dir=tmp_path) as launcher:
        proc = launcher.start(bundled_spec("example_single_tool_call"))
        assert proc.host == "127.0.0.1" and _listening(proc.port) == {"0100007F"}  # 127.0.0.1
        head = HeadServer(load_config([], env_yaml=None), port=0)
        assert head.host == "127.0.0.1" and _listening(head.port) == {"0100007F"}
        head.stop()
        caplog.set_level(logging.WARNING, logger="nemo_gym_env.launch")
        exposed = launcher.start(fixture_specs("reliability")["rel_faulty"], host="0.0.0.0")
        assert _listening(exposed.port) == {"00000000"}
        launcher.stop("rel_faulty")
    parent_warning = [r.getMessage() for r in caplog.records if "reachable from the network" in r.getMessage()]
    assert parent_warning and "0.0.0.0" in parent_warning[0]
    child_log = (tmp_path / "rel_faulty.log").read_text()
    assert "WARNING" in child_log and "reachable from the network" in child_log
    assert "reachable from the network" not in (tmp_path / "example_single_tool_call.log").read_text()
    figures.record("default bind address (servers, head server)", "127.0.0.1")
    figures.record("warning when bound to 0.0.0.0", "launcher log + server log")


def test_serve_warns_when_the_head_server_is_reachable_from_the_network(tmp_path):
    proc = subprocess.Popen([*CLI, "serve", "example_single_tool_call", "+head_server.port=0",
                             "+head_server.host=0.0.0.0"], cwd=tmp_path, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            if proc.stdout.readline().startswith("Ctrl-C to stop"):
                ready = True
                break
        assert ready, "serve did not start"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "warning: the head server listens on 0.0.0.0, reachable from the network" in err


# ---- the code sandbox ---------------------------------------------------------------------------------


ESCAPES = {
    # the launched server's own environment holds the cookie-signing secret
    "read the server's environment": ("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())", "forbidden"),
    "read own environment": ("print(open('/proc/self/environ').read())", "forbidden"),
    "/proc/self/root trick": ("print(open('/proc/self/root/etc/passwd').read())", "forbidden"),
    "/proc/self/cwd trick": ("print(open('/proc/self/cwd/../../../etc/passwd').read())", "forbidden"),
    "read another run's scratch": ("print(open('{other}/solution.py').read())", "forbidden"),
    "list the temp dir": ("import os\nprint(os.listdir('{tmp}'))", "forbidden"),
    "/dev/shm": ("open('/dev/shm/pwned', 'w').write('x')", "forbidden"),
    "unix socket": ("import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/var/run/docker.sock')", "forbidden"),
    "io.open_code": ("import io\nprint(io.open_code('/etc/passwd').read())", "forbidden"),
    "O_PATH descriptor": ("import os\nfd = os.open('/etc', os.O_PATH)\nprint(os.listdir(fd))", "forbidden"),
    "thread bomb": ("import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()",
                    "runtime_error"),
    "descriptor bomb": ("files = [open(f'f{i}', 'w') for i in range(10**6)]", "runtime_error"),
    "mmap bomb": ("import mmap\nmaps = [mmap.mmap(-1, 1 << 28) for _ in range(64)]", "runtime_error"),
    "ignore the CPU-limit signal": ("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
                                    "timeout"),
    "unbounded recursion": ("import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)", None),
}


def _code_gen_server(tmp_path: Path) -> Any:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spec = with_config(bundled_spec("code_gen"), scratch_root=str(scratch), timeout_s=3, max_concurrent=2)
    return spec, scratch


def _verify_code(url: str, code: str) -> dict[str, Any]:
    row = {"responses_create_params": {"input": [{"role": "user", "content": "Solve it."}], "tools": []},
           "verifier_metadata": {"unit_tests": {"inputs": ["hello\n"], "outputs": ["hello\n"]}}}
    message = {"type": "message", "role": "assistant", "id": "m", "status": "completed",
               "content": [{"type": "output_text", "text": f"```python\n{code}\n```", "annotations": []}]}
    body = {**row, "response": make_response([message]).model_dump(mode="json", exclude_none=True)}
    reply = httpx.post(f"{url}/verify", json=body, timeout=120, trust_env=False)
    assert reply.status_code == 200, reply.text[:500]
    return reply.json()


def test_sandbox_resists_the_escapes_its_own_tests_do_not_try(tmp_path, figures):
    spec, scratch = _code_gen_server(tmp_path)
    other = Path(tempfile.mkdtemp(prefix="nemo-gym-code-other-run-", dir=scratch))
    (other / "solution.py").write_text("OTHER_TENANT_SECRET = 'CANARY-other'\n")
    kinds = {}
    with Launcher(ready_timeout_s=60) as launcher:
        proc = launcher.start(spec)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        secret = dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)[SESSION_SECRET_ENV.encode()]
        for name, (code, expected) in ESCAPES.items():
            reply = _verify_code(proc.url, code.replace("{other}", str(other)).replace("{tmp}", str(scratch)))
            kinds[name] = reply["failure_kind"]
            assert reply["reward"] == 0.0, name
            if expected is not None:
                assert reply["failure_kind"] == expected, (name, reply["test_results"])
            text = json.dumps(reply)
            assert secret.decode() not in text and "CANARY-other" not in text and "root:" not in text, name
        assert httpx.get(f"{proc.url}/", timeout=10).json() == {"status": "ok"}
        assert _verify_code(proc.url, "print(input())")["reward"] == 1.0
    assert sorted(p.name for p in scratch.iterdir()) == [other.name], "a scratch directory was left behind"
    figures.record("escapes tried", len(ESCAPES))
    figures.record("outcomes", kinds)


def test_a_disk_bomb_is_bounded_only_by_time(tmp_path, figures):
    """RLIMIT_FSIZE bounds each file, not their sum: a program writing file after file fills the
    disk at disk speed until its time is up. Measured here; the scratch directory is removed after."""
    from nemo_gym_env.servers.code_gen.sandbox import Limits, Sandbox

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sandbox = Sandbox(Limits(timeout_s=2, max_file_bytes=16 << 20), max_concurrent=1, scratch_root=str(scratch))
    code = "i = 0\nwhile True:\n    with open(f'b{i}', 'wb') as f:\n        f.write(b'0' * (16 << 20))\n    i += 1"

    async def bomb() -> tuple[Any, int]:
        peak = 0
        run = asyncio.create_task(sandbox.run(code))
        while not run.done():
            await asyncio.sleep(0.1)
            used = sum(f.stat().st_size for f in scratch.rglob("*") if f.is_file()) if scratch.exists() else 0
            peak = max(peak, used)
        return run.result(), peak

    result, peak = asyncio.run(bomb())
    assert result.kind == "timeout"
    assert list(scratch.iterdir()) == [], "the scratch directory was not removed"
    figures.record("disk written by one 2 s run (16 MiB files)", round(peak / (1 << 20)), "MiB")
    figures.record("left on disk after the run", 0, "MiB")
    shutil.rmtree(scratch, ignore_errors=True)
