"""Tests of the ``code_gen`` server: code extraction, output comparison, the sandbox, the verifier.

The hostile programs run for real in the sandbox; each must get reward 0 without harming the
test process, the files around it, or the server, and must leave no process behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import doctest
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import (
    app_client,
    assistant_message,
    example_rows,
    function_call,
    play_episode,
    reasoning,
    server_config,
    verify,
)
from nemo_gym_env.servers.code_gen import app as app_module
from nemo_gym_env.servers.code_gen import sandbox as sandbox_module
from nemo_gym_env.servers.code_gen import scripted

NAME = "code_gen"
HERE = Path(__file__).resolve().parent.parent


Server = app_module.CodeGenResourcesServer

ROWS = example_rows(HERE)
TIMEOUT_S = 2.0


def _processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker`` (the sandbox passes its scratch dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and int(entry) != os.getpid():
            found.append(int(entry))
    return found


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    root = tmp_path / "scratch"
    root.mkdir()
    return root


@pytest.fixture
def client(scratch_root: Path):
    config = {"timeout_s": TIMEOUT_S, "scratch_root": str(scratch_root), "max_concurrent": 2}
    with app_client(Server, config, name=NAME) as c:
        yield c
    # Every run cleaned up after itself: no scratch directory, no process left behind.
    assert list(scratch_root.iterdir()) == []
    assert _processes_mentioning(str(scratch_root)) == []


def fenced(code: str) -> dict[str, Any]:
    return assistant_message(f"Solution:\n```python\n{code}\n```\n")


def stdio_row(inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Solve it."}], "tools": []},
        "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs}},
    }


def call_row(fn_name: str, inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    row = stdio_row(inputs, outputs)
    row["verifier_metadata"]["unit_tests"]["fn_name"] = fn_name
    return row


ECHO_ROW = stdio_row(["hello\n"], ["hello\n"])


# ---- extraction and comparison (pure functions) ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```", "print(2)"),
        ("```python\nprint(1)\n```\nSample output:\n```\n1\n```", "print(1)"),
        ("```py title=sol.py\nprint(3)\n```", "print(3)"),
        ("```Python3\nprint(4)\n```", "print(4)"),
        ("```\nprint(5)\n```", "print(5)"),
        ("````python\nprint('```')\n````", "print('```')"),
        ("```python\nprint(1)\n```\n```python\nprint(2)\n", "print(1)"),  # unclosed last block: ignored
        ("import sys\nprint(sys.stdin.read())", "import sys\nprint(sys.stdin.read())"),
        ("print('日本語 😀')", "print('日本語 😀')"),
    ],
)
def test_extract_code(text: str, code: str) -> None:
    assert app_module.extract_code(text)[0] == code


@pytest.mark.parametrize(
    "text",
    [None, "", "   ", "I would use a loop.", "hello", "42", "```python\n\n```", "```js\nconsole.log(1)\n```"],
)
def test_extract_code_finds_none(text: str | None) -> None:
    code, reason = app_module.extract_code(text)
    assert code is None and reason


def test_extract_code_limits() -> None:
    assert app_module.extract_code("```python\nx = 1\n```", max_code_chars=3)[0] is None
    code, reason = app_module.extract_code("x = 1\n" * 10, max_response_chars=20)
    assert code is None and "max_response_chars=20" in reason


def test_extract_code_on_pathological_text_is_fast() -> None:
    started = time.perf_counter()
    for text in ["`" * 1_000_000, "```\n" * 250_000, "(" * 99_999, "x" * 1_000_000]:
        app_module.extract_code(text)
    assert time.perf_counter() - started < 10.0


@pytest.mark.parametrize(
    ("actual", "expected", "ok"),
    [
        ("3\n", "3", True),
        ("  3  \r\n4 \n\n", "3\n4", True),
        ("1.50 2\n", "1.5 2.0", True),
        ("1e2\n", "100", True),
        ("3\n4\n", "3", False),
        ("3", "4", False),
        ("nan", "nan", True),
        ("abc", "abd", False),
        ("", "", True),
        ("", "0", False),
    ],
)
def test_stdout_matches(actual: str, expected: str, ok: bool) -> None:
    assert app_module.stdout_matches(actual, expected)[0] is ok


def test_json_equal() -> None:
    assert app_module.json_equal([1, [2, {"a": None}]], [1.0, [2, {"a": None}]])
    assert not app_module.json_equal(True, 1)
    assert not app_module.json_equal([0], [False])
    assert not app_module.json_equal({"a": 1}, {"a": 1, "b": 2})
    assert not app_module.json_equal([1, 2], [2, 1])
    assert not app_module.json_equal("1", 1)


# ---- verify: scripted players -----------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_play_gets_1(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, []))
    tests = row["verifier_metadata"]["unit_tests"]
    assert result["reward"] == 1.0, result["test_results"]
    assert result["num_tests"] == result["num_passed"] == len(tests["inputs"])
    assert result["partial_credit"] == 1.0 and result["failure_kind"] is None
    assert result["result"] == [True] * len(tests["inputs"])
    assert result["extracted_model_code"] == scripted.SOLUTIONS[row["hash_id"]].rstrip("\n")
    assert result["difficulty"] == row["verifier_metadata"]["difficulty"]
    assert "failure_reason" not in result


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_play_gets_0(client: TestClient, index: int) -> None:
    result = verify(client, ROWS[index], scripted.scripted_action(ROWS[index], [], correct=False))
    assert result["reward"] == 0.0 and result["num_passed"] == 0
    assert result["failure_kind"] == "wrong_answer"


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_lookup_program_passes_any_row(client: TestClient, index: int) -> None:
    row = ROWS[index]
    assert verify(client, row, [fenced(scripted.lookup_program(row))])["reward"] == 1.0


# ---- verify: outcomes and metrics -------------------------------------------------------------


def test_partial_credit(client: TestClient) -> None:
    row = stdio_row(["1\n", "2\n", "3\n"], ["1\n", "4\n", "3\n"])
    result = verify(client, row, [fenced("print(input())")])
    assert result["reward"] == 0.0
    assert (result["num_tests"], result["num_passed"]) == (3, 2)
    assert result["partial_credit"] == pytest.approx(2 / 3)
    assert result["result"] == [True, False, True]
    assert [t["kind"] for t in result["test_results"]] == ["passed", "wrong_answer", "passed"]
    assert result["failure_kind"] == "wrong_answer" and result["failure_reason"].startswith(
        "test 1: wrong_answer"
    )


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("def broken(:\n    pass", "syntax_error"),
        ("print(1 / 0)", "runtime_error"),
        ("import sys\nprint('partial')\nsys.exit(3)", "runtime_error"),
        ("raise SystemExit('bye')", "runtime_error"),
    ],
)
def test_failure_kinds(client: TestClient, code: str, kind: str) -> None:
    result = verify(client, ECHO_ROW, [fenced(code)])
    assert (result["reward"], result["failure_kind"]) == (0.0, kind)


def test_exit_quit_and_sys_exit_0_are_fine(client: TestClient) -> None:
    for code in [
        "print(input())\nexit()",
        "print(input())\nquit(0)",
        "import sys\nprint(input())\nsys.exit(0)",
    ]:
        assert verify(client, ECHO_ROW, [fenced(code)])["reward"] == 1.0


def test_common_stdio_idioms(client: TestClient) -> None:
    row = stdio_row(["2\n3 4\n"], ["7\n"])
    programs = [
        "import sys\nn = int(sys.stdin.readline())\nprint(sum(map(int, sys.stdin.readline().split())))",
        "data = open(0).read().split()\nprint(int(data[1]) + int(data[2]))",
        "import sys\ndata = sys.stdin.buffer.read().split()\nsys.stdout.write(str(int(data[1]) + int(data[2])) + '\\n')",
        "input()\nprint(sum(map(int, input().split())))",
        (
            "import sys, threading\nthreading.stack_size(1 << 26)\nsys.setrecursionlimit(10000)\n"
            "def main():\n    input()\n    print(sum(map(int, input().split())))\n"
            "t = threading.Thread(target=main)\nt.start()\nt.join()"
        ),
        "if __name__ == '__main__':\n    input()\n    print(sum(map(int, input().split())))",
        "import tempfile\nwith tempfile.TemporaryFile() as f:\n    f.write(b'x')\ninput()\nprint(7)",
        "with open('notes.txt', 'w') as f:\n    f.write('scratch is writable')\ninput()\nprint(7)",
        "import asyncio\nasync def main():\n    input()\n    print(sum(map(int, input().split())))\nasyncio.run(main())",
    ]
    for program in programs:
        result = verify(client, row, [fenced(program)])
        assert result["reward"] == 1.0, (program, result["test_results"])


def test_call_based_function_and_solution_class(client: TestClient) -> None:
    row = call_row("add", ["1\n2", "[1]\n[2]"], ["3", "[1, 2]"])
    assert verify(client, row, [fenced("def add(a, b):\n    return a + b")])["reward"] == 1.0
    assert (
        verify(client, row, [fenced("class Solution:\n    def add(self, a, b):\n        return a + b")])[
            "reward"
        ]
        == 1.0
    )
    tuples = call_row("pair", ["1"], ["[1, 2]"])
    assert verify(client, tuples, [fenced("def pair(a):\n    return (a, a + 1)")])["reward"] == 1.0


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("def other(x):\n    return x", "runtime_error"),
        ("def f(x):\n    return {x}", "wrong_answer"),  # a set is not JSON
        ("def f(x):\n    return x == 1", "wrong_answer"),  # true is not 1
        ("def f(x):\n    exit(0)", "runtime_error"),
    ],
)
def test_call_based_failures(client: TestClient, code: str, kind: str) -> None:
    result = verify(client, call_row("f", ["1"], ["1"]), [fenced(code)])
    assert (result["reward"], result["failure_kind"]) == (0.0, kind)


def test_call_based_main_guard_does_not_run(client: TestClient) -> None:
    code = "def f(x):\n    return x * 2\nif __name__ == '__main__':\n    print(input())"
    assert verify(client, call_row("f", ["21"], ["42"]), [fenced(code)])["reward"] == 1.0


def test_stop_on_first_failure(scratch_root: Path) -> None:
    config = {"timeout_s": TIMEOUT_S, "scratch_root": str(scratch_root), "stop_on_first_failure": True}
    with app_client(Server, config, name=NAME) as c:
        result = verify(
            c, stdio_row(["1\n", "2\n", "3\n"], ["0\n", "2\n", "3\n"]), [fenced("print(input())")]
        )
    assert [t["kind"] for t in result["test_results"]] == ["wrong_answer", "skipped", "skipped"]
    assert result["num_passed"] == 0 and result["failure_kind"] == "wrong_answer"


def test_verify_budget_bounds_a_slow_program(scratch_root: Path) -> None:
    config = {"timeout_s": 1, "verify_timeout_s": 1.5, "scratch_root": str(scratch_root)}
    row = stdio_row(["a\n"] * 6, ["a\n"] * 6)
    with app_client(Server, config, name=NAME) as c:
        result = verify(c, row, [fenced("import time\ntime.sleep(100)")])
    tests = result["test_results"]
    assert [t["kind"] for t in tests] == ["timeout"] * 6
    # Each test that ran took its full second, so the 1.5 s budget let one or two start (two on
    # an idle machine, one when starting the interpreter took long); the rest never started.
    ran = [t for t in tests if t["time_s"] > 0]
    assert tests[: len(ran)] == ran and 1 <= len(ran) <= 2
    assert all(t["detail"].startswith("verify_timeout_s=1.5 spent") for t in tests[len(ran):])


# ---- verify: adversarial answers ----------------------------------------------------------------


@pytest.mark.parametrize(
    "output",
    [
        [],
        [assistant_message("")],
        [assistant_message("I am not sure how to solve this.")],
        [reasoning("```python\nprint(input())\n```")],
        [function_call(0, 0, "run", {})],
    ],
)
def test_no_code_is_reward_0(client: TestClient, output: list[dict[str, Any]]) -> None:
    result = verify(client, ECHO_ROW, output)
    assert (result["reward"], result["failure_kind"], result["extracted_model_code"]) == (
        0.0,
        "no_code",
        None,
    )
    assert result["num_tests"] == 1 and result["num_passed"] == 0 and result["failure_reason"]


def test_only_the_last_assistant_message_and_last_block_count(client: TestClient) -> None:
    first = assistant_message("```python\nprint(input())\n```", "m1")
    last = assistant_message(
        "```python\nprint('nope')\n```\nor better:\n```python\nprint(input())\n```", "m2"
    )
    assert verify(client, ECHO_ROW, [first, last])["reward"] == 1.0
    later = assistant_message("```python\nprint('nope')\n```", "m3")
    assert verify(client, ECHO_ROW, [last, later])["reward"] == 0.0


def test_unicode_program_and_io(client: TestClient) -> None:
    row = stdio_row(["naïve 東京 😀\n"], ["😀 東京 naïve\n"])
    code = "# comentário: inverter as palavras\nprint(' '.join(reversed(input().split())))"
    assert verify(client, row, [fenced(code)])["reward"] == 1.0


def test_enormous_answer_in_bounded_time(client: TestClient) -> None:
    text = "Thinking... " * 90_000 + "\n```python\nprint(input())\n```"  # ~1.1 MB
    started = time.perf_counter()
    result = verify(client, ECHO_ROW, [assistant_message(text)])
    assert (result["reward"], result["failure_kind"]) == (0.0, "no_code")
    assert "max_response_chars" in result["failure_reason"]
    shorter = verify(client, ECHO_ROW, [assistant_message(text[-200_000:])])
    assert shorter["reward"] == 1.0
    assert time.perf_counter() - started < 30


def test_huge_input_and_a_program_that_ignores_it(scratch_root: Path) -> None:
    # What is tested is that 5 MB of input reach the program (or are dropped when it does not read them),
    # not speed: a roomy time limit, so a busy machine (the suite under pytest-xdist) cannot fail it.
    config = {"timeout_s": 20.0, "scratch_root": str(scratch_root), "max_concurrent": 2}
    big = "x" * 5_000_000 + "\n"
    with app_client(Server, config, name=NAME) as client:
        for code, expected in (("print(len(input()))", "5000000\n"), ("print('ok')", "ok\n")):
            verdict = verify(client, stdio_row([big], [expected]), [fenced(code)])
            assert verdict["reward"] == 1.0, verdict["test_results"]
    assert list(scratch_root.iterdir()) == [] and _processes_mentioning(str(scratch_root)) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"verifier_metadata": None}, "verifier_metadata"),
        ({"verifier_metadata": {}}, "unit_tests"),
        ({"verifier_metadata": {"unit_tests": {"inputs": ["1"], "outputs": []}}}, "outputs"),
        ({"verifier_metadata": {"unit_tests": {"inputs": [], "outputs": []}}}, "at least one test"),
        ({"verifier_metadata": {"unit_tests": {"inputs": [1], "outputs": ["1"]}}}, "inputs"),
        (
            {"verifier_metadata": {"unit_tests": {"inputs": ["{oops"], "outputs": ["1"], "fn_name": "f"}}},
            "JSON",
        ),
        (
            {
                "verifier_metadata": {
                    "unit_tests": {"inputs": ["1"], "outputs": ["1"], "fn_name": "not valid"}
                }
            },
            "fn_name",
        ),
    ],
)
def test_malformed_row_is_422(client: TestClient, change: dict[str, Any], field: str) -> None:
    row = {**ECHO_ROW, **change}
    if change.get("verifier_metadata") is None:
        row.pop("verifier_metadata")
    reply = client.post(
        "/verify", json={**row, "response": make_response([fenced("print(1)")]).model_dump(mode="json")}
    )
    assert reply.status_code == 422
    assert field in reply.text and "/verify" in reply.json()["error"]


def test_verify_echoes_the_row_and_drops_stale_failures(client: TestClient) -> None:
    row = {**ROWS[0], "failure_kind": "timeout", "failure_reason": "old", "reward": 0.0}
    result = verify(client, row, scripted.scripted_action(ROWS[0], []))
    assert result["reward"] == 1.0 and result["failure_kind"] is None and "failure_reason" not in result
    for key in ("id", "hash_id", "dataset", "source", "verifier_metadata"):
        assert result[key] == ROWS[0][key]


# ---- hostile programs ---------------------------------------------------------------------------


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A directory outside every scratch directory, with a file the programs must not touch."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("CANARY-SECRET")
    return folder


HOSTILE = {
    "fork bomb": ("import os\nwhile True:\n    os.fork()", "forbidden"),
    "infinite loop": ("while True:\n    pass", "timeout"),
    "huge allocation": ("x = bytearray(10**11)", "memory"),
    "many allocations": ("x = []\nwhile True:\n    x.append(bytes(10**8))", "memory"),
    "read /etc/passwd": ("print(open('/etc/passwd').read())", "forbidden"),
    "read outside scratch": ("print(open('{canary}/secret.txt').read())", "forbidden"),
    "read the server's source": ("print(open('{server_source}').read())", "forbidden"),
    "list the root": ("import os\nprint(os.listdir('/'))", "forbidden"),
    "write outside scratch": ("open('{canary}/written.txt', 'w').write('pwned')", "forbidden"),
    "socket to 127.0.0.1": (
        "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\ns.sendall(b'pwned')",
        "forbidden",
    ),
    "dns lookup": ("import socket\nprint(socket.gethostbyname('localhost'))", "forbidden"),
    "sleep": ("import time\ntime.sleep(100)", "timeout"),
    "subprocess.run": ("import subprocess\nsubprocess.run(['ls'])", "forbidden"),
    "os.system": ("import os\nos.system('touch {canary}/system.txt')", "forbidden"),
    "os.exec": ("import os\nos.execv('/bin/sh', ['sh', '-c', 'touch {canary}/exec.txt'])", "forbidden"),
    "multiprocessing": ("import multiprocessing as mp\nmp.Process(target=print).start()", "forbidden"),
    "delete a file": ("import os\nos.remove('{canary}/secret.txt')", "forbidden"),
    "delete a tree": ("import shutil\nshutil.rmtree('{canary}')", "forbidden"),
    "rename out": ("import os\nos.rename('{canary}/secret.txt', 'stolen.txt')", "forbidden"),
    "print 100 MB": ("print('x' * 100_000_000)", "output_limit"),
    "print forever": ("while True:\n    print('y' * 1000)", "output_limit"),
    "kill the parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "forbidden"),
    "raise the limits": ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "forbidden"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).system(b'touch {canary}/ctypes.txt')", "forbidden"),
    "ctypes by the back door": (
        "import importlib.util as u\nu.module_from_spec(u.find_spec('_ctypes'))",
        "forbidden",
    ),
    "directory descriptor outside scratch": (
        "import os\nfd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\nos.mkdir('pwned', dir_fd=fd)",
        "forbidden",
    ),
    "chmod through a descriptor": (
        "import os\nos.chmod(os.open(os.__file__, os.O_RDONLY), 0o777)",
        "forbidden",
    ),
    "remove relative to a dir_fd": (
        "import os\nos.mkdir('a')\nfd = os.open('a', os.O_RDONLY)\nos.remove('../../../outside/secret.txt', dir_fd=fd)",
        "forbidden",
    ),
    "deep directory tree": (
        (
            "import os\nos.mkdir('d')\nfd = os.open('d', os.O_RDONLY)\nwhile True:\n"
            "    os.mkdir('d', dir_fd=fd)\n    nfd = os.open('d', os.O_RDONLY, dir_fd=fd)\n    os.close(fd)\n    fd = nfd"
        ),
        "timeout",
    ),
    "kill by pidfd": (
        "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({victim}), signal.SIGKILL)",
        "runtime_error",  # the functions are gone: AttributeError
    ),
    "device node": (
        "import os, stat\nos.mknod('null', 0o600 | stat.S_IFCHR, os.makedev(1, 3))",
        "runtime_error",
    ),
    "re-create posix": (
        "import _imp, importlib.util as u\nposix = _imp.create_builtin(u.find_spec('posix'))\nposix.pidfd_open({victim})",
        "forbidden",
    ),
    "huge file": ("with open('big.bin', 'wb') as f:\n    f.write(b'0' * (64 << 20))", "output_limit"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_gets_0_and_harms_nothing(client: TestClient, canary: Path, name: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    victim = subprocess.Popen(["sleep", "60"])
    code, kind = HOSTILE[name]
    code = code.format(
        canary=canary, port=listener.getsockname()[1], server_source=HERE / "app.py", victim=victim.pid
    )
    started = time.perf_counter()
    try:
        result = verify(client, ECHO_ROW, [fenced(code)])
        elapsed = time.perf_counter() - started
        assert (result["reward"], result["failure_kind"]) == (0.0, kind), result["test_results"]
        assert elapsed < TIMEOUT_S + 8
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
        victim_survived = victim.poll() is None
        victim.kill()
        victim.wait()
    assert victim_survived
    assert sorted(p.name for p in canary.iterdir()) == ["secret.txt"]
    assert (canary / "secret.txt").read_text() == "CANARY-SECRET"
    assert "CANARY-SECRET" not in json.dumps(result) and "root:" not in json.dumps(result["test_results"])
    assert client.get("/").json() == {"status": "ok"}
    # The server still verifies normally afterwards.
    assert verify(client, ECHO_ROW, [fenced("print(input())")])["reward"] == 1.0


# ---- the sandbox itself -------------------------------------------------------------------------


def test_unaudited_functions_are_gone(client: TestClient) -> None:
    code = (
        "import os, posix, signal, time, importlib\n"
        "importlib.reload(posix)\n"
        "names = [(os, 'pidfd_open'), (posix, 'mknod'), (os, 'mkfifo'), (os, 'sched_setaffinity'),\n"
        "         (os, 'setpriority'), (signal, 'pidfd_send_signal'), (time, 'clock_settime')]\n"
        "print(any(hasattr(m, n) for m, n in names))\n"
        "print(any(f.__name__ in ('mknod', 'mkfifo') for f in os.supports_dir_fd))"
    )
    assert verify(client, stdio_row([""], ["False\nFalse\n"]), [fenced(code)])["reward"] == 1.0


def test_sandbox_bounds_concurrency_and_keeps_the_loop_free(scratch_root: Path) -> None:
    sandbox = sandbox_module.Sandbox(
        sandbox_module.Limits(timeout_s=5), max_concurrent=2, scratch_root=str(scratch_root)
    )

    async def scenario() -> tuple[float, float, list[str]]:
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, len(_processes_mentioning(str(scratch_root))))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        runs = asyncio.gather(*[sandbox.run("import time\ntime.sleep(0.6)") for _ in range(4)])
        # While the sandboxes sleep, the event loop keeps turning: these ticks (0.25 s) end
        # while the runs (two rounds of 0.6 s) are still going. A blocking run would hold the
        # loop until it finished, and the ticks would come after the runs.
        for _ in range(5):
            await asyncio.sleep(0.05)
        turned_while_running = not runs.done()
        kinds = [r.kind for r in await runs]
        watcher.cancel()
        return time.perf_counter() - started, turned_while_running, kinds, peak

    elapsed, turned_while_running, kinds, peak = asyncio.run(scenario())
    assert kinds == ["ok"] * 4
    assert elapsed >= 1.2  # 4 runs of 0.6 s, two at a time
    assert peak <= 2
    assert turned_while_running


def test_sandbox_minimal_environment_and_limits(scratch_root: Path) -> None:
    sandbox = sandbox_module.Sandbox(
        sandbox_module.Limits(timeout_s=5, memory_bytes=256 << 20), scratch_root=str(scratch_root)
    )
    code = (
        "import os, resource, sys\n"
        "print(sorted(os.environ))\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0] == 256 << 20)\n"
        "print(resource.getrlimit(resource.RLIMIT_CPU)[0])\n"
        "print(os.getcwd() == os.path.dirname(__file__), sys.flags.isolated, sys.flags.no_site)\n"
        "print(os.getpgrp() == os.getpid())\n"
    )
    run = asyncio.run(sandbox.run(code))
    assert run.kind == "ok", run.stderr
    lines = run.stdout.decode().splitlines()
    assert lines[0] == str(["HOME", "LANG", "PATH", "TMPDIR"])
    assert lines[1:] == ["True", "5", "True 1 1", "True"]


def test_config_accepts_nemo_gym_keys() -> None:
    config = app_module.CodeGenResourcesServerConfig.model_validate(
        {"num_processes": 8, "unit_test_timeout_secs": 3, "debug": False}
    )
    assert (config.max_concurrent, config.timeout_s) == (8, 3.0)
    server = Server.from_config({"num_processes": 3, "unit_test_timeout_secs": 7}, name=NAME)
    assert server.sandbox.max_concurrent == 3 and server.sandbox.limits.timeout_s == 7.0


# ---- data, config, modules ----------------------------------------------------------------------


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    assert [row["id"] for row in ROWS] == list(range(5))
    assert set(scripted.SOLUTIONS) == {row["hash_id"] for row in ROWS}
    for row in ROWS:
        app_module.CodeGenRunRequest.model_validate(row)
        assert "```python" in row["responses_create_params"]["input"][0]["content"]


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["domain"] and server["description"]
    app_module.CodeGenResourcesServerConfig.model_validate(server)


@pytest.mark.parametrize("module", [app_module, scripted])
def test_doctests(module: Any) -> None:
    assert doctest.testmod(module).failed == 0


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert source.rstrip().endswith('if __name__ == "__main__":\n    CodeGenResourcesServer.run_webserver()')
    assert "from nemo_gym_env." in source and "from ." not in source


# ---- real processes -------------------------------------------------------------------------------


@pytest.mark.slow
def test_launched_server_survives_hostile_programs(tmp_path: Path, canary: Path) -> None:
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    scratch = tmp_path / "launched-scratch"
    scratch.mkdir()
    spec = bundled_spec(NAME)
    spec = dataclasses.replace(
        spec, config={**spec.config, "scratch_root": str(scratch), "timeout_s": TIMEOUT_S}
    )
    hostile = [
        HOSTILE[n][0].format(canary=canary, port=9, server_source=HERE / "app.py")
        for n in ("fork bomb", "kill the parent", "sleep", "print 100 MB", "huge allocation", "os.system")
    ]

    async def scenario(url: str) -> list[float]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:

            async def one(code: str) -> float:
                body = {**ECHO_ROW, "response": make_response([fenced(code)]).model_dump(mode="json")}
                reply = await http.post("/verify", json=body)
                assert reply.status_code == 200, reply.text
                return reply.json()["reward"]

            rewards = await asyncio.gather(*[one(code) for code in hostile])
            # The event loop of the server stays free while sandboxes run: liveness answers at once.
            assert (await http.get("/")).json() == {"status": "ok"}
            rewards.append(await one("print(input())"))
            return rewards

    with Launcher() as launcher:
        process = launcher.start(spec)
        assert asyncio.run(scenario(process.url)) == [0.0] * len(hostile) + [1.0]
        assert process.alive
        for row in ROWS:
            body = {
                **row,
                "response": make_response(scripted.scripted_action(row, [])).model_dump(mode="json"),
            }
            assert httpx.post(f"{process.url}/verify", json=body, timeout=60).json()["reward"] == 1.0
    assert _processes_mentioning(str(scratch)) == []
    assert list(scratch.iterdir()) == []
    assert sorted(p.name for p in canary.iterdir()) == ["secret.txt"]


@pytest.mark.slow
def test_gym_make_plays_every_task() -> None:
    import gymnasium as gym

    import nemo_gym_env

    env = gym.make(nemo_gym_env.env_id(NAME))
    try:
        for index in range(len(ROWS)):
            for correct in (True, False):
                reward, terminated, truncated, _ = play_episode(
                    env, scripted.scripted_action, correct=correct, max_turns=1, options={"task_index": index}
                )
                assert (reward, terminated, truncated) == (float(correct), True, False)
    finally:
        env.close()
