"""Tests of the ``math`` server: answer extraction, math-verify equivalence, timeouts, the judge."""

from __future__ import annotations

import dataclasses
import doctest
import importlib.util
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

pytest.importorskip("math_verify", reason="the math server needs the math extra: pip install -e '.[math]'")

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import (
    app_client,
    assistant_message,
    example_rows,
    reasoning,
    server_config,
    times_slower_than_plain,
    verify,
)
from nemo_gym_env.servers.math import answer, equivalence, judge, scripted
from nemo_gym_env.servers.math.app import MathResourcesServer

NAME = "math"
HERE = Path(__file__).resolve().parent.parent
ROWS = example_rows(HERE)
SLOW_ANSWER = "9^{9^{9}}"  # SymPy tries to compute 9**387420489 and never finishes
JUDGE_KEY = "sk-judge-test-key-0123456789abcdef"


def row_with(expected: str, question: str | None = None) -> dict[str, Any]:
    row = {**ROWS[0], "expected_answer": expected}
    if question is not None:
        row["question"] = question
    return row


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    server = MathResourcesServer.from_config({"verify_workers": 2}, name=NAME)
    with app_client(server) as c:
        yield c


# ---- extraction (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed {7}", "7"),
        (r"\fbox{8}", "8"),
        (r"first \boxed{1}, then \boxed{2}", "2"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{\boxed{5}}", "5"),
        (r"\boxed{3} and finally \boxed{4", "3"),  # a box cut off mid-way does not count
        (r"\boxed{x^{2^{3}}} end", "x^{2^{3}}"),
        ("no box here: 12", None),
        (r"\boxed{}", None),
        ("", None),
    ],
)
def test_last_boxed_answer(text: str, expected: str | None) -> None:
    assert answer.extract_answer(text) == expected


@pytest.mark.parametrize(
    ("fallback", "text", "expected"),
    [
        ("last_number", "We get 3 apples, then 1,250 more.", "1250"),
        ("last_number", "The ratio is -3/4", "-3/4"),
        ("last_number", "no digits", None),
        ("answer_colon", "Work...\n**Answer:** $\\frac{1}{2}$.\n", r"\frac{1}{2}"),
        ("answer_colon", "answer: 3\nFinal Answer: 5", "5"),
        ("answer_colon", "nothing", None),
        ("none", "The answer is 5", None),
        ("last_number", r"\boxed{7} then 9", "7"),  # a box always wins over the fallback
    ],
)
def test_answer_fallbacks(fallback: str, text: str, expected: str | None) -> None:
    assert answer.extract_answer(text, fallback) == expected  # type: ignore[arg-type]


def test_extraction_is_linear_on_adversarial_text() -> None:
    for text in ["\\boxed{" * 15_000, "{}" * 50_000, "\\boxed{" + "{" * 99_000, "1 " * 50_000]:
        assert times_slower_than_plain(lambda t: answer.extract_answer(t, "last_number"), text[-100_000:]) < 50


def test_last_assistant_text_ignores_reasoning_and_caps() -> None:
    output = [
        assistant_message("early \\boxed{1}", "m1"),
        reasoning("\\boxed{2}"),
        assistant_message("x" * 50 + "tail", "m2"),
    ]
    assert answer.last_assistant_text(output, 10) == ("xxxxxxtail", True)
    assert answer.last_assistant_text(output, 1000)[0].endswith("tail")
    assert answer.last_assistant_text([reasoning("\\boxed{2}")], 1000) == (None, False)


# ---- equivalence (math-verify, in this process) ------------------------------------------


@pytest.mark.parametrize(
    ("expected", "given"),
    [
        (r"\frac{1}{2}", "0.5"),
        ("0.5", "1/2"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\{1, 2\}", r"\{2, 1\}"),
        ("[1, 2)", "[1,2)"),
        (r"$\frac{3}{4}$", r"\dfrac{3}{4}"),
        ("x^2+2x+1", "(x+1)^2"),
        ("-3", "−3"),  # U+2212 minus sign
    ],
)
def test_equivalent_forms(expected: str, given: str) -> None:
    assert equivalence.equivalent(expected, given, timeout_s=30.0) == "equal"


@pytest.mark.parametrize(
    ("expected", "given"), [("720", "721"), ("(1, 2)", "(2, 1)"), (r"\{-1, 0, 1\}", r"\{-1, 1\}"), ("5", "")]
)
def test_unequal_forms(expected: str, given: str) -> None:
    assert equivalence.equivalent(expected, given, timeout_s=30.0) == "unequal"


def test_equivalence_stops_itself_at_its_time_limit() -> None:
    started = time.monotonic()
    assert equivalence.equivalent("2", SLOW_ANSWER, timeout_s=0.5) == "timeout"
    assert time.monotonic() - started < 5


# ---- /verify ----------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_answer_gets_1(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, [], correct=True))
    assert result["reward"] == 1.0 and result["library_reward"] == 1.0
    assert result["extracted_answer"] == row["expected_answer"]
    assert result["judge_reward"] is None and result["answer_truncated"] is False
    assert "failure_reason" not in result


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_answer_gets_0(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, [], correct=False))
    assert result["reward"] == 0.0 and result["library_reward"] == 0.0
    assert result["extracted_answer"] == scripted.wrong_answer(row["expected_answer"])
    assert "failure_reason" not in result


@pytest.mark.parametrize(
    ("expected", "text"),
    [
        (r"\frac{1}{2}", r"It is \boxed{0.5}"),
        ("0.5", r"It is $\boxed{\dfrac{1}{2}}$"),
        (r"2\sqrt{2}", r"\boxed{\sqrt{8}}"),
        (r"\{-1, 0, 1\}", r"\boxed{\{1, -1, 0\}}"),
    ],
)
def test_symbolic_not_string_comparison(client: TestClient, expected: str, text: str) -> None:
    assert verify(client, row_with(expected), [assistant_message(text)])["reward"] == 1.0


def test_last_box_wins(client: TestClient) -> None:
    row = row_with("720")
    assert verify(client, row, [assistant_message(r"maybe \boxed{360}, no: \boxed{720}")])["reward"] == 1.0
    result = verify(client, row, [assistant_message(r"\boxed{720}? No, \boxed{360}.")])
    assert (result["reward"], result["extracted_answer"]) == (0.0, "360")


@pytest.mark.parametrize(
    "output",
    [
        [],
        [assistant_message("")],
        [assistant_message("The sum of the angles is seven hundred and twenty.")],
        [
            {
                "type": "message",
                "role": "assistant",
                "id": "m",
                "status": "completed",
                "content": [{"type": "refusal", "refusal": "\\boxed{720}"}],
            }
        ],
    ],
    ids=["empty-output", "empty-text", "no-answer", "refusal-only"],
)
def test_no_answer_gets_0_without_failure(client: TestClient, output: list[dict[str, Any]]) -> None:
    result = verify(client, row_with("720"), output)
    assert (result["reward"], result["extracted_answer"], result["library_reward"]) == (0.0, None, 0.0)
    assert "failure_reason" not in result


def test_answer_only_in_reasoning_gets_0(client: TestClient) -> None:
    result = verify(client, row_with("720"), [reasoning(r"so \boxed{720}"), assistant_message("See above.")])
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)
    result = verify(client, row_with("720"), [reasoning(r"\boxed{720}")])
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


def test_only_the_last_assistant_message_counts(client: TestClient) -> None:
    output = [assistant_message(r"\boxed{720}", "m1"), assistant_message("On reflection I am unsure.", "m2")]
    assert verify(client, row_with("720"), output)["reward"] == 0.0


def test_no_assistant_message_at_all(client: TestClient) -> None:
    output = [
        {"type": "message", "role": "user", "content": r"\boxed{720}"},
        {"type": "function_call", "call_id": "c", "name": "calc", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c", "output": r"\boxed{720}"},
    ]
    result = verify(client, row_with("720"), output)
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


def test_unicode_around_the_answer(client: TestClient) -> None:
    text = "答案是 🎉 — d'après le calcul, $\\boxed{\\frac{\\pi}{2}}$ ✅"
    assert verify(client, row_with("π/2"), [assistant_message(text)])["reward"] == 1.0
    assert verify(client, row_with("-3"), [assistant_message("結果: \\boxed{−3}")])["reward"] == 1.0


@pytest.mark.slow
def test_enormous_output_is_bounded(client: TestClient) -> None:
    padding = "Let me think about this once more. " * 150_000  # ~5 MB
    started = time.monotonic()
    tail = verify(client, row_with("720"), [assistant_message(padding + r"So \boxed{720}.")])
    head = verify(client, row_with("720"), [assistant_message(r"\boxed{720} " + padding)])
    braces = verify(client, row_with("720"), [assistant_message("\\boxed{" + "{" * 5_000_000)])
    assert time.monotonic() - started < 60
    assert (tail["reward"], tail["answer_truncated"]) == (1.0, True)
    assert (head["reward"], head["extracted_answer"], head["answer_truncated"]) == (0.0, None, True)
    assert (braces["reward"], braces["answer_truncated"]) == (0.0, True)


def test_verify_echoes_the_row_and_replaces_stale_metrics(client: TestClient) -> None:
    row = {**ROWS[2], "uuid": "u-1", "reward": 0.0, "failure_reason": "old", "extracted_answer": "x"}
    result = verify(client, row, scripted.scripted_action(ROWS[2], []))
    assert result["reward"] == 1.0 and result["uuid"] == "u-1"
    assert result["extracted_answer"] == ROWS[2]["expected_answer"]
    assert "failure_reason" not in result
    echoed = result["responses_create_params"]["input"][0]
    assert echoed["content"] == ROWS[2]["responses_create_params"]["input"][0]["content"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"expected_answer": None}, "expected_answer"),
        ({"expected_answer": "   "}, "expected_answer"),
        ({"expected_answer": ["1"]}, "expected_answer"),
        ({"responses_create_params": {"input": "x", "temperature": "hot"}}, "temperature"),
        ({"response": {"output": []}}, "response"),
    ],
)
def test_malformed_rows_are_422(client: TestClient, change: dict[str, Any], field: str) -> None:
    body = {**ROWS[0], "response": make_response([assistant_message(r"\boxed{720}")]).model_dump(mode="json")}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    reply = client.post("/verify", json=body)
    assert reply.status_code == 422
    assert "/verify" in reply.json()["error"] and field in reply.text


def test_no_tool_routes(client: TestClient) -> None:
    server = MathResourcesServer.from_config({}, name=NAME)
    assert server.tool_names(server.setup_webserver()) == []
    assert client.get("/").json() == {"status": "ok"}
    assert all(not row["responses_create_params"].get("tools") for row in ROWS)


# ---- time limits -------------------------------------------------------------------------


@pytest.mark.slow
def test_slow_verification_times_out_and_the_next_one_runs() -> None:
    server = MathResourcesServer.from_config({"verify_workers": 1, "verify_timeout_s": 1.0}, name=NAME)
    with app_client(server) as c:
        assert verify(c, row_with("2"), [assistant_message(r"\boxed{2}")])["reward"] == 1.0  # workers warm
        started = time.monotonic()
        result = verify(c, row_with("2"), [assistant_message(f"\\boxed{{{SLOW_ANSWER}}}")])
        assert time.monotonic() - started < 1.0 + 5.0
        assert result["reward"] == 0.0 and result["library_reward"] == 0.0
        assert result["failure_kind"] == "verify_timeout"
        assert "verify_timeout_s=1" in result["failure_reason"]
        assert result["extracted_answer"] == SLOW_ANSWER
        started = time.monotonic()
        assert verify(c, row_with("2"), [assistant_message(r"\boxed{2}")])["reward"] == 1.0
        assert time.monotonic() - started < 5.0


def test_tiny_time_limit_gives_0_with_failure_reason() -> None:
    server = MathResourcesServer.from_config({"verify_workers": 1, "verify_timeout_s": 0.001}, name=NAME)
    with app_client(server) as c:
        result = verify(c, row_with("x^2+2x+1"), [assistant_message(r"\boxed{(x+1)^2}")])
    assert result["reward"] == 0.0 and result["failure_kind"] == "verify_timeout"
    assert "failure_reason" in result


# ---- the judge ---------------------------------------------------------------------------


class FakeJudge:
    """A real OpenAI-compatible chat-completions server on loopback; the answer text picks its reply."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request) -> Any:
            body = await request.json()
            self.requests.append({"authorization": request.headers.get("authorization"), "body": body})
            prompt = body["messages"][-1]["content"]
            if "BROKEN" in prompt:
                return JSONResponse({"error": {"message": "judge exploded"}}, status_code=500)
            if "LEAK" in prompt:
                detail = f"Incorrect API key provided: {request.headers.get('authorization', '')[7:]}"
                return JSONResponse({"error": {"message": detail}}, status_code=401)
            text = "They match. [[A=B]]" if "half" in prompt else "No verdict, sorry."
            return {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                ],
            }

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(5)
        self._sock.close()


@pytest.fixture(scope="module")
def fake_judge() -> Iterator[FakeJudge]:
    judge_server = FakeJudge()
    yield judge_server
    judge_server.close()


@pytest.fixture(scope="module")
def judged(fake_judge: FakeJudge) -> Iterator[TestClient]:
    config = {
        "verify_workers": 1,
        "judge_base_url": fake_judge.url,
        "judge_model": "fake-judge",
        "judge_api_key": JUDGE_KEY,
        "judge_timeout_s": 10,
    }
    with app_client(MathResourcesServer, config, name=NAME) as c:
        yield c


def test_judge_decides_when_the_library_says_unequal(
    judged: TestClient, fake_judge: FakeJudge, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    before = len(fake_judge.requests)
    result = verify(judged, row_with(r"\frac{1}{2}"), [assistant_message(r"\boxed{\text{one half}}")])
    assert (result["library_reward"], result["judge_reward"], result["reward"]) == (0.0, 1.0, 1.0)
    [request] = fake_judge.requests[before:]
    assert request["authorization"] == f"Bearer {JUDGE_KEY}"
    prompt = request["body"]["messages"][-1]["content"]
    assert r"\frac{1}{2}" in prompt and r"\text{one half}" in prompt and "regular hexagon" in prompt
    assert JUDGE_KEY not in json.dumps(result) and JUDGE_KEY not in caplog.text


def test_judge_is_not_asked_when_the_library_agrees(judged: TestClient, fake_judge: FakeJudge) -> None:
    before = len(fake_judge.requests)
    result = verify(judged, row_with(r"\frac{1}{2}"), [assistant_message(r"\boxed{0.5}")])
    assert (result["reward"], result["judge_reward"]) == (1.0, None)
    assert len(fake_judge.requests) == before


@pytest.mark.parametrize("answer_text", ["BROKEN", "LEAK", "MUTE"])
def test_judge_failure_keeps_the_library_reward(
    judged: TestClient, answer_text: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    result = verify(judged, row_with("720"), [assistant_message(f"\\boxed{{\\text{{{answer_text}}}}}")])
    assert (result["reward"], result["library_reward"], result["judge_reward"]) == (0.0, 0.0, None)
    assert result["judge_error"]
    assert JUDGE_KEY not in json.dumps(result) and JUDGE_KEY not in caplog.text


def test_unreachable_judge_keeps_the_library_reward() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {
        "verify_workers": 1,
        "judge_base_url": f"http://127.0.0.1:{port}/v1",
        "judge_model": "m",
        "judge_api_key": JUDGE_KEY,
        "judge_timeout_s": 2,
    }
    with app_client(MathResourcesServer, config, name=NAME) as c:
        result = verify(c, row_with("720"), [assistant_message(r"\boxed{721}")])
    assert (result["reward"], result["judge_reward"]) == (0.0, None)
    assert "judge request failed" in result["judge_error"]


def test_judge_config_hides_the_key() -> None:
    server = MathResourcesServer.from_config(
        {"judge_base_url": "http://127.0.0.1:1/v1", "judge_model": "m", "judge_api_key": JUDGE_KEY}, name=NAME
    )
    assert JUDGE_KEY not in repr(server) and JUDGE_KEY not in repr(server.config)
    assert JUDGE_KEY not in str(server.config.model_dump())


# ---- config, data, scripted --------------------------------------------------------------


def test_judge_without_model_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="judge_model"):
        MathResourcesServer.from_config({"judge_base_url": "http://127.0.0.1:1/v1"}, name=NAME)


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed")
def test_ray_address_without_ray_fails_at_start_up() -> None:
    with pytest.raises(RuntimeError, match=r"pip install 'nemo-gym-env\[ray\]'"):
        MathResourcesServer.from_config({"ray_address": "auto"}, name=NAME)
    with pytest.raises(RuntimeError, match="ray"):
        MathResourcesServer.from_config({"ray_head_node_address": "127.0.0.1:6379"}, name=NAME)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_tasks_verify() -> None:
    """A fresh private Ray (cold workers: process start, math-verify import) and a 1 s limit: the
    correct answer still scores 1.0 (the limit counts from when a warm worker takes the task), and a
    comparison that runs out of time is a failure, not a reward of 0."""
    import ray

    from nemo_gym_env.protocol.failures import verdict_failure

    was_connected = ray.is_initialized()
    server = MathResourcesServer.from_config({"ray_address": "local", "verify_timeout_s": 1.0}, name=NAME)
    try:
        with app_client(server) as c:
            first = verify(c, row_with("0.5"), [assistant_message(r"\boxed{\frac12}")])
            assert (first["reward"], first.get("failure_kind")) == (1.0, None), first
            assert verify(c, row_with("0.5"), [assistant_message(r"\boxed{\frac13}")])["reward"] == 0.0
            slow = verify(c, row_with("2"), [assistant_message(f"\\boxed{{{SLOW_ANSWER}}}")])
            assert slow["failure_kind"] == "verify_timeout" and "no verdict" in slow["failure_reason"]
            kind, reason = verdict_failure(slow)
            assert kind == "verify_timeout" and "infrastructure; no reward" in reason
            assert verify(c, row_with("0.5"), [assistant_message(r"\boxed{1/2}")])["reward"] == 1.0
    finally:
        if not was_connected:  # the private Ray this test started: stop it, or it outlives the test
            ray.shutdown()


def test_defaults() -> None:
    config = MathResourcesServer.from_config({}, name=NAME).config
    assert (config.answer_fallback, config.verify_timeout_s, config.max_answer_chars) == (
        "none",
        10.0,
        100_000,
    )
    assert config.judge_base_url is None and config.ray_address is None


def test_example_rows_are_valid() -> None:
    from nemo_gym_env.servers.math.app import MathRunRequest

    assert len(ROWS) == 5
    for row in ROWS:
        MathRunRequest.model_validate(row)
        assert set(row) == {"responses_create_params", "expected_answer"}
        [prompt] = row["responses_create_params"]["input"]
        assert prompt["role"] == "user" and "\\boxed{}" in prompt["content"]


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["domain"] == "math" and server["description"]
    assert "judge_api_key" not in server


def test_doctests() -> None:
    for module in (answer, equivalence, judge, scripted):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert 'if __name__ == "__main__":\n    MathResourcesServer.run_webserver()' in source
    assert "from nemo_gym_env." in source and "from ." not in source


# ---- a launched server -------------------------------------------------------------------


@pytest.mark.slow
def test_liveness_answers_while_32_slow_verifications_run() -> None:
    import httpx

    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    spec = bundled_spec(NAME)
    spec = dataclasses.replace(spec, config={**spec.config, "verify_workers": 2, "verify_timeout_s": 0.5})
    body = {
        **row_with("2"),
        "response": make_response([assistant_message(f"\\boxed{{{SLOW_ANSWER}}}")]).model_dump(mode="json"),
    }
    with Launcher() as launcher:
        url = launcher.start(spec).url
        results: list[dict[str, Any]] = []

        def post() -> None:
            with httpx.Client(timeout=120) as http:
                results.append(http.post(f"{url}/verify", json=body).json())

        threads = [threading.Thread(target=post) for _ in range(32)]
        for thread in threads:
            thread.start()
        latencies = []
        with httpx.Client(timeout=10) as http:
            while any(thread.is_alive() for thread in threads):
                started = time.monotonic()
                assert http.get(f"{url}/").json() == {"status": "ok"}
                latencies.append(time.monotonic() - started)
                time.sleep(0.05)
        for thread in threads:
            thread.join()
    assert len(latencies) >= 10 and max(latencies) < 1.0, max(latencies)
    assert len(results) == 32
    assert all(r["reward"] == 0.0 and r["failure_kind"] == "verify_timeout" for r in results)


@pytest.mark.slow
def test_gymnasium_episode() -> None:
    import gymnasium as gym

    import nemo_gym_env  # noqa: F401  (registers the ids)

    env = gym.make("NemoGym/math-v0")
    try:
        for correct, reward in ((True, 1.0), (False, 0.0)):
            obs, info = env.reset(seed=0)
            assert info["tools"] == [] and obs[0]["role"] == "user"
            row = env.unwrapped.task
            obs, r, terminated, truncated, info = env.step(scripted.scripted_action(row, [], correct=correct))
            assert (r, terminated, truncated) == (reward, True, False)
    finally:
        env.close()
