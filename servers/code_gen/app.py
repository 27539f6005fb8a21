"""``code_gen``: the model writes a Python program; it is run against the row's unit tests.

Rows use NeMo Gym's ``code_gen`` shape (LiveCodeBench's): ``verifier_metadata.unit_tests``
holds ``inputs`` and ``outputs`` (lists of strings) and an optional ``fn_name``.

* Without ``fn_name`` (stdin/stdout): the program reads ``inputs[i]`` on stdin; its stdout
  must equal ``outputs[i]`` line by line after stripping (numeric tokens compare as decimals,
  so ``1.0`` equals ``1``).
* With ``fn_name`` (call-based): ``inputs[i]`` holds one JSON value per line, the positional
  arguments; the program's ``fn_name`` (a method of ``Solution()`` when it defines that class)
  is called with them and its return value, as JSON, must equal ``json.loads(outputs[i])``.

The program is the last ```python fenced block of the *last* assistant message (reasoning
items are ignored); without a python block, the last unlabelled block; without any block, the
whole message if it parses as Python. Each test runs in a fresh sandboxed interpreter
(``sandbox.py``), one test after another, at most ``max_concurrent`` interpreters at a time
across all requests.

Reward: 1.0 iff every test passes. Metrics: ``num_tests``, ``num_passed``, ``partial_credit``
(passed / total), ``result`` (per test), ``test_results`` (``{passed, kind, time_s, detail}``
per test), ``failure_kind`` (the first failing test's: ``timeout``, ``memory``,
``runtime_error``, ``syntax_error``, ``output_limit``, ``forbidden``, ``wrong_answer``; or
``no_code``; ``sandbox_lost`` when the Ray task running a test never came back, which is no
verdict on the program), ``extracted_model_code``, ``unit_tests_time_taken``.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
from decimal import Decimal, InvalidOperation
from typing import Any

from fastapi import FastAPI
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from nemo_gym_env.errors import TaskTimeout
from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym_env.server.workers import RayRunner
from nemo_gym_env.servers.code_gen.sandbox import Limits, RunResult, Sandbox, run_sandboxed

__all__ = [
    "CodeGenResourcesServer",
    "CodeGenResourcesServerConfig",
    "CodeGenRunRequest",
    "CodeGenVerifyRequest",
    "CodeGenVerifyResponse",
    "TestResult",
    "UnitTests",
    "VerifierMetadata",
    "call_arguments",
    "code_blocks",
    "extract_code",
    "json_equal",
    "last_assistant_text",
    "stdout_matches",
]

PYTHON_LANGS = frozenset({"python", "py", "python3", "py3"})


class CodeGenResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the code server. NeMo Gym's ``num_processes`` and
    ``unit_test_timeout_secs`` are accepted as ``max_concurrent`` and ``timeout_s``.

    Attributes:
        max_concurrent: Sandboxed interpreters running at once, over all requests.
        timeout_s: Wall-clock (and CPU) seconds per test.
        memory_bytes: Address-space limit per test (``RLIMIT_AS``).
        max_output_bytes: Standard output beyond this fails the test (``output_limit``).
        max_file_bytes: Largest file a program may write in its scratch directory.
        max_processes: ``RLIMIT_NPROC`` (not enforced when the server runs as root).
        verify_timeout_s: Budget of one verification; tests not started by then fail as ``timeout``.
        stop_on_first_failure: Skip the remaining tests once one fails (faster; ``partial_credit``
            then counts only the tests run before).
        max_code_chars: Longer programs are not run (``no_code``).
        max_response_chars: Longer answers are not searched for code (``no_code``).
        scratch_root: Where per-run scratch directories are made (default: the system temp dir).
        ray_address: Run each test as a Ray task on this cluster (the same sandbox, started by
            the task on its node) instead of in this server's process; ``max_concurrent`` CPUs
            are then reserved on the cluster at start (a placement group), the tasks run there.
            Needs ``ray``.
        ray_head_node_address: NeMo Gym's name for ``ray_address`` (also set by the config's
            top-level key and by ``RayLauncher``).
    """

    model_config = ConfigDict(populate_by_name=True)

    max_concurrent: int = Field(
        default=4, ge=1, validation_alias=AliasChoices("max_concurrent", "num_processes")
    )
    timeout_s: float = Field(
        default=10.0, gt=0, validation_alias=AliasChoices("timeout_s", "unit_test_timeout_secs")
    )
    memory_bytes: int = Field(default=1 << 30, ge=64 << 20)
    max_output_bytes: int = Field(default=1 << 20, ge=1)
    max_file_bytes: int = Field(default=16 << 20, ge=0)
    max_processes: int = Field(default=128, ge=1)
    verify_timeout_s: float = Field(default=120.0, gt=0)
    stop_on_first_failure: bool = False
    max_code_chars: int = Field(default=100_000, ge=1)
    max_response_chars: int = Field(default=1_000_000, ge=1)
    scratch_root: str | None = None
    ray_address: str | None = None
    ray_head_node_address: str | None = None


class UnitTests(BaseModel):
    """The tests of one row (LiveCodeBench / NeMo Gym shape)."""

    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> UnitTests:
        if not self.inputs:
            raise ValueError("unit_tests needs at least one test")
        if len(self.inputs) != len(self.outputs):
            raise ValueError(
                f"{len(self.inputs)} inputs but {len(self.outputs)} outputs: give one output per input"
            )
        if self.fn_name is not None:
            if not self.fn_name.isidentifier():
                raise ValueError(f"fn_name {self.fn_name!r} is not a Python identifier")
            for i, (given, expected) in enumerate(zip(self.inputs, self.outputs)):
                try:
                    call_arguments(given)
                    json.loads(expected)
                except ValueError as exc:
                    raise ValueError(f"test {i}: call-based inputs and outputs must be JSON: {exc}") from None
        return self


class VerifierMetadata(BaseModel):
    """``verifier_metadata`` of a row: ``unit_tests`` plus anything else (e.g. ``difficulty``), kept."""

    model_config = ConfigDict(extra="allow")

    unit_tests: UnitTests


class CodeGenRunRequest(BaseRunRequest):
    """A dataset row: the problem statement plus its tests."""

    verifier_metadata: VerifierMetadata


class CodeGenVerifyRequest(CodeGenRunRequest, BaseVerifyRequest):
    """The row plus the finished episode."""


class TestResult(BaseModel):
    """How one test fared: passed or not, the outcome kind, the time it took, and why."""

    __test__ = False  # not a pytest test class

    passed: bool
    kind: str
    time_s: float
    detail: str = ""


class CodeGenVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the metrics (see the module docstring)."""

    extracted_model_code: str | None
    result: list[bool]
    num_tests: int
    num_passed: int
    partial_credit: float
    failure_kind: str | None
    test_results: list[TestResult]
    unit_tests_time_taken: float
    difficulty: Any = None


# ---- reading the answer ------------------------------------------------------------------------


def last_assistant_text(output: list[Any]) -> str | None:
    """Text of the last assistant message in ``output`` (its ``output_text`` parts joined), or ``None``."""
    for item in reversed(output):
        if getattr(item, "type", None) == "message" and getattr(item, "role", None) == "assistant":
            content = getattr(item, "content", None)
            if isinstance(content, str):
                return content
            return "".join(
                getattr(part, "text", "") or ""
                for part in content or ()
                if getattr(part, "type", None) == "output_text"
            )
    return None


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Closed fenced blocks of ``text`` as ``(language, code)``; an unclosed last block is dropped.

    >>> code_blocks("Try:\\n```python\\nprint(1)\\n```\\nor\\n```\\nprint(2)\\n```")
    [('python', 'print(1)'), ('', 'print(2)')]
    """
    blocks: list[tuple[str, str]] = []
    language, lines, inside = "", [], False
    for line in text.split("\n"):
        stripped = line.strip()
        if not inside:
            if stripped.startswith("```"):
                info = stripped.lstrip("`").split()
                language, lines, inside = (info[0].lower() if info else ""), [], True
        elif stripped.startswith("```") and not stripped.strip("`"):
            blocks.append((language, "\n".join(lines)))
            inside = False
        else:
            lines.append(line)
    return blocks


def _looks_like_a_program(text: str) -> bool:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    trivial = (ast.Constant, ast.Name)
    return any(not (isinstance(s, ast.Expr) and isinstance(s.value, trivial)) for s in tree.body)


def extract_code(
    text: str | None, *, max_code_chars: int = 100_000, max_response_chars: int = 1_000_000
) -> tuple[str | None, str]:
    """The program in an answer, or ``None`` and why.

    The last ```python block; else the last unlabelled block; else the whole text if it
    parses as Python (and is more than a bare name or constant).

    >>> extract_code("```python\\nprint(1)\\n```\\n```python\\nprint(2)\\n```")
    ('print(2)', 'last python block of 2 blocks')
    >>> extract_code("Just use a loop.")
    (None, 'no code block, and the answer is not a Python program')
    """
    if text is None or not text.strip():
        return None, "no assistant message with text in the response"
    if len(text) > max_response_chars:
        return None, f"the answer has {len(text)} characters, over max_response_chars={max_response_chars}"
    blocks = code_blocks(text)
    python = [code for language, code in blocks if language in PYTHON_LANGS]
    plain = [code for language, code in blocks if not language]
    if python:
        code, how = python[-1], f"last python block of {len(blocks)} blocks"
    elif plain:
        code, how = plain[-1], f"last unlabelled block of {len(blocks)} blocks"
    elif len(text) <= max_code_chars and _looks_like_a_program(text):
        code, how = text, "the whole answer"
    else:
        return None, "no code block, and the answer is not a Python program"
    if not code.strip():
        return None, "the code block is empty"
    if len(code) > max_code_chars:
        return None, f"the program has {len(code)} characters, over max_code_chars={max_code_chars}"
    return code, how


# ---- comparing results -----------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _numbers_equal(actual: str, expected: str) -> bool:
    a, e = actual.split(), expected.split()
    if len(a) != len(e):
        return False
    try:
        return all(Decimal(x) == Decimal(y) for x, y in zip(a, e))
    except (InvalidOperation, ValueError):
        return False


def stdout_matches(actual: str, expected: str) -> tuple[bool, str]:
    """Whether a program's stdout equals the expected output, line by line after stripping.

    Lines that differ as text still match when they hold the same numbers (``1.0`` vs ``1``).

    >>> stdout_matches("3 \\n1.50\\n", "3\\n1.5")
    (True, 'output matches')
    >>> stdout_matches("3\\n", "4")
    (False, 'line 1 differs')
    """
    got, want = _lines(actual), _lines(expected)
    if len(got) != len(want):
        return False, f"{len(got)} lines of output; expected {len(want)}"
    for number, (a, e) in enumerate(zip(got, want), start=1):
        if a != e and not _numbers_equal(a, e):
            return False, f"line {number} differs"
    return True, "output matches"


def call_arguments(given: str) -> list[Any]:
    """Positional arguments of a call-based test: one JSON value per non-blank line.

    >>> call_arguments('[1, 2]\\n"abc"\\n')
    [[1, 2], 'abc']
    """
    return [json.loads(line) for line in given.split("\n") if line.strip()]


def json_equal(actual: Any, expected: Any) -> bool:
    """JSON equality where ``true`` is not ``1`` (Python's ``True == 1`` does not leak in).

    >>> json_equal([1, 2.0, {"a": True}], [1.0, 2, {"a": True}]), json_equal([True], [1])
    (True, False)
    """
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(json_equal(a, e) for a, e in zip(actual, expected))
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(json_equal(actual[k], expected[k]) for k in actual)
    if isinstance(actual, (list, dict)) or isinstance(expected, (list, dict)):
        return False
    return actual == expected


def _judge(run: RunResult, expected: str, call_based: bool) -> TestResult:
    time_s = round(run.wall_s, 4)
    if run.kind == "bad_return":
        return TestResult(passed=False, kind="wrong_answer", time_s=time_s, detail="return value is not JSON")
    if run.kind != "ok":
        tail = run.stderr.decode("utf-8", "replace").strip().splitlines()
        return TestResult(passed=False, kind=run.kind, time_s=time_s, detail=(tail[-1] if tail else "")[:300])
    if call_based:
        try:
            ok = json_equal(json.loads(run.result or b""), json.loads(expected))
        except (ValueError, RecursionError):
            ok = False
        detail = "return value matches" if ok else "return value differs"
    else:
        ok, detail = stdout_matches(run.stdout.decode("utf-8", "replace"), expected)
    return TestResult(passed=ok, kind="passed" if ok else "wrong_answer", time_s=time_s, detail=detail)


# ---- the server ---------------------------------------------------------------------------------


class CodeGenResourcesServer(SimpleResourcesServer):
    """The ``code_gen`` resources server (no tools, only ``/verify``)."""

    config: CodeGenResourcesServerConfig = Field(default_factory=CodeGenResourcesServerConfig)
    _sandbox: Sandbox = PrivateAttr()
    _ray: RayRunner | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        c = self.config
        limits = Limits(c.timeout_s, c.memory_bytes, c.max_output_bytes, c.max_file_bytes, c.max_processes)
        self._sandbox = Sandbox(limits, max_concurrent=c.max_concurrent, scratch_root=c.scratch_root)
        address = c.ray_address or c.ray_head_node_address
        if address:
            # max_concurrent CPUs reserved on the cluster for the tests (a clear error when ray is missing)
            self._ray = RayRunner(address, slots=c.max_concurrent, label="code_gen sandbox")

    def setup_webserver(self) -> FastAPI:
        """Standard routes only; with ``ray_address`` the tests' CPUs are reserved before the server answers."""
        app = super().setup_webserver()
        if self._ray is not None:
            app.router.on_startup.append(self._ray.start)
            app.router.on_shutdown.append(self._ray.aclose)
        return app

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox every test runs in."""
        return self._sandbox

    async def run_tests(self, code: str, tests: UnitTests) -> list[TestResult]:
        """Run ``code`` against every test, in order, within the verification budget."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.verify_timeout_s
        results: list[TestResult] = []
        failed = False
        for given, expected in zip(tests.inputs, tests.outputs):
            if failed and self.config.stop_on_first_failure:
                results.append(
                    TestResult(passed=False, kind="skipped", time_s=0.0, detail="an earlier test failed")
                )
                continue
            if loop.time() >= deadline:
                detail = f"verify_timeout_s={self.config.verify_timeout_s} spent before this test"
                results.append(TestResult(passed=False, kind="timeout", time_s=0.0, detail=detail))
                continue
            call = None if tests.fn_name is None else (tests.fn_name, call_arguments(given))
            run = await self.run_program(code, stdin="" if call else given, call=call)
            results.append(_judge(run, expected, tests.fn_name is not None))
            failed = failed or not results[-1].passed
        return results

    async def run_program(self, code: str, *, stdin: str = "", call: tuple[str, list[Any]] | None = None,
                          ) -> RunResult:
        """One sandboxed run: in this server's process, or as a Ray task with ``ray_address``."""
        if self._ray is None:
            return await self._sandbox.run(code, stdin=stdin, call=call)
        limits = self._sandbox.limits
        try:  # the sandbox's own wall-clock limit applies on the node; this only bounds a lost task
            return await self._ray.run(run_sandboxed, code, stdin, call, limits, self.config.scratch_root,
                                       timeout_s=limits.timeout_s + 60.0)
        except TaskTimeout:  # the task (or its node) was lost: no verdict on the program
            return RunResult("sandbox_lost", None, stderr=b"the Ray task did not come back in time")

    async def verify(self, body: CodeGenVerifyRequest) -> CodeGenVerifyResponse:
        """Extract the program from the last assistant message and run it against the row's tests."""
        tests = body.verifier_metadata.unit_tests
        code, how = extract_code(
            last_assistant_text(body.response.output),
            max_code_chars=self.config.max_code_chars,
            max_response_chars=self.config.max_response_chars,
        )
        started = time.perf_counter()
        if code is None:
            results = [TestResult(passed=False, kind="no_code", time_s=0.0, detail=how) for _ in tests.inputs]
        else:
            results = await self.run_tests(code, tests)
        passed = [r.passed for r in results]
        index, first_failure = next(((i, r) for i, r in enumerate(results) if not r.passed), (None, None))
        fields: dict[str, Any] = {
            **body.model_dump(),
            # Echoed as given: no defaults added (``fn_name: null``) to the row's own metadata.
            "verifier_metadata": body.verifier_metadata.model_dump(exclude_unset=True),
            "reward": float(all(passed)),
            "extracted_model_code": code,
            "result": passed,
            "num_tests": len(results),
            "num_passed": sum(passed),
            "partial_credit": sum(passed) / len(results),
            "failure_kind": first_failure.kind if first_failure else None,
            "test_results": results,
            "unit_tests_time_taken": round(time.perf_counter() - started, 4),
            "difficulty": (body.verifier_metadata.model_extra or {}).get("difficulty"),
        }
        fields.pop("failure_reason", None)  # a re-verified row may carry an earlier one
        if first_failure is not None:
            fields["failure_reason"] = f"test {index}: {first_failure.kind}: {first_failure.detail}"[:500]
        return CodeGenVerifyResponse(**fields)


if __name__ == "__main__":
    CodeGenResourcesServer.run_webserver()
