"""``nemo-gym-env check`` as a process: every bundled server passes; servers that hang, fail or are not
resources servers fail each check with evidence, within the time limit, without a traceback."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym_env.checker.suite import CHECKS
from nemo_gym_env.launch.catalog import bundled_servers

from ..cli.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve_script(tmp_path: Path) -> Iterator:
    """Run a small server script on a free port; yield its URL; stop it after."""
    started: list[subprocess.Popen] = []

    def serve(source: str) -> str:
        port = _free_port()
        path = tmp_path / f"server_{port}.py"
        path.write_text(textwrap.dedent(source).replace("PORT", str(port)))
        started.append(subprocess.Popen([sys.executable, str(path)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the test server did not start")

    yield serve
    for process in started:
        process.kill()
        process.wait()


def checks_of(stdout: str) -> list[dict]:
    data = json.loads(stdout)
    return [c for report in (data if isinstance(data, list) else [data]) for c in report["checks"]]


def test_every_bundled_server_passes():
    names = sorted(bundled_servers())
    done = run_cli("check", *names, "--json", "--concurrency", "8", "--timeout", "60", timeout=1100)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    reports = json.loads(done.stdout)
    assert len(reports) == len(names)
    for report in reports:
        assert report["ok"] and [c["name"] for c in report["checks"]] == list(CHECKS), report["target"]
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        for must in ("reachable", "protocol", "session_cookie", "isolation", "end_empty", "end_wrong",
                     "malformed_body", "oversized_body", "concurrency"):
            assert statuses[must] == "pass", (report["target"], must, report["checks"])
        if report["protocol"] == "resources":
            assert statuses["session_contract"] == "pass" and statuses["tools"] == "pass", report["target"]
        if report["target"].startswith("retail_support"):  # a Gymnasium-protocol server whose rows offer tools
            tools = next(c for c in report["checks"] if c["name"] == "tools")
            assert tools["status"] == "pass" and "6 valid function definition(s)" in tools["evidence"], tools
    # docs/bring_your_env.md names the servers whose unknown_session warns (stateless verify); every other passes.
    doc = (Path(__file__).resolve().parents[2] / "docs" / "bring_your_env.md").read_text()
    listed = doc.split("safe: a forged cookie", 1)[1].split("They\nare:", 1)[1].split(". Every server", 1)[0]
    said = set(re.findall(r"`(\w+)`", listed))
    warns = {r["target"].split(" ")[0] for r in reports for c in r["checks"] if c["name"] == "unknown_session" and c["status"] == "warn"}
    assert warns == said, (sorted(warns), sorted(said))
    assert all(c["status"] in ("pass", "warn") for r in reports for c in r["checks"] if c["name"] == "unknown_session")


def test_a_gymnasium_server_whose_rows_offer_a_broken_tool_fails_the_tools_check(tmp_path):
    from nemo_gym_env.launch.catalog import bundled_dataset

    row = json.loads(bundled_dataset("retail_support").read_text().splitlines()[0])
    row["responses_create_params"]["tools"][0]["parameters"] = {"type": "array"}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    done = run_cli("check", "retail_support", "--input", str(rows), "--json", timeout=600)
    tools = next(c for c in checks_of(done.stdout) if c["name"] == "tools")
    assert done.returncode == 1 and tools["status"] == "fail" and "find_customer_by_email" in tools["evidence"], tools


def test_the_table_names_every_check_and_a_hosted_env_checks_too():
    done = run_cli("check", "gymnasium:CliffWalking-v1", "--concurrency", "4", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in CHECKS:
        assert name in done.stdout
    assert "(protocol: gymnasium)" in done.stdout


HANGS = """
    import socket, time
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", PORT))
    server.listen(64)
    held = []
    while True:
        conn, _ = server.accept()
        held.append(conn)  # read nothing, answer nothing
"""

FAILS = """
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def boom(request):
        return PlainTextResponse("Internal Server Error", status_code=500)

    app = Starlette(routes=[Route("/{path:path}", boom, methods=["GET", "POST"])])
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="error")
"""

NOT_A_SERVER = """
    import http.server
    http.server.ThreadingHTTPServer(("127.0.0.1", PORT), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


@pytest.mark.parametrize(("source", "why"), [(HANGS, "no answer within 1 s"), (FAILS, "-> 500"),
                                             (NOT_A_SERVER, "not a resources server")])
def test_a_bad_server_fails_every_check_with_evidence_in_time(serve_script, source, why):
    url = serve_script(source)
    started = time.monotonic()
    done = run_cli("check", url, "--json", "--timeout", "1", "--time-limit", "20", timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    checks = checks_of(done.stdout)
    assert [c["name"] for c in checks] == list(CHECKS)
    failed = [c for c in checks if c["status"] == "fail"]
    assert len(failed) >= len(CHECKS) - 1 and all(c["evidence"] for c in checks)
    assert any(why in c["evidence"] for c in checks), checks
    assert elapsed < 20 + 30  # the time limit, plus the interpreter's start


def test_a_remote_url_is_refused_and_a_wrong_target_is_one_line():
    done = run_cli("check", "http://192.0.2.1:8000")
    assert done.returncode == 1 and "--allow-remote" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("check", "no_such_server")
    assert done.returncode == 1 and "no bundled server named 'no_such_server'" in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2


JUDGES_NOTHING = """
    import uvicorn
    from fastapi import Request
    from nemo_gym_env.server import BaseVerifyRequest, SimpleResourcesServer

    class Broken(SimpleResourcesServer):
        async def verify(self, body: BaseVerifyRequest):
            return {**body.model_dump()}["expected_answer"]  # KeyError: the row has none

    uvicorn.run(Broken.from_config({"name": "broken"}).build_app(), host="127.0.0.1", port=PORT, log_level="error")
"""

EXCEPTION_AS_REASON = """
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/seed_session")
    async def seed():
        return {}

    @app.post("/verify")
    async def verify(body: dict):
        return {**body, "reward": 0.0, "failure_reason": "KeyError: 'expected_answer'"}

    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="error")
"""

SEEDS_A_LIST = """
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/seed_session")
    async def seed():
        return [1, 2, 3]

    @app.post("/verify")
    async def verify(body: dict):
        return {**body, "reward": 1.0}

    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="error")
"""


@pytest.mark.parametrize(("source", "failing", "why"), [
    (JUDGES_NOTHING, {"end_empty", "end_wrong"}, "verifier_error"),
    (EXCEPTION_AS_REASON, {"end_empty", "end_wrong"}, "failure_reason is an exception"),
    (SEEDS_A_LIST, {"session_cookie"}, "not a JSON object"),
])
def test_a_verifier_that_judges_nothing_or_a_malformed_seed_fails(serve_script, source, failing, why):
    url = serve_script(source)
    done = run_cli("check", url, "--json", "--timeout", "10", "--time-limit", "120", timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    statuses = {c["name"]: c for c in checks_of(done.stdout)}
    for name in failing:
        assert statuses[name]["status"] == "fail" and why in statuses[name]["evidence"], statuses[name]
