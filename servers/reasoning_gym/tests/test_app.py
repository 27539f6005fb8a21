"""In-process tests of the ``reasoning_gym`` server (its scoring workers are real processes)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("reasoning_gym")

from fastapi.testclient import TestClient

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import (
    app_client,
    assistant_message,
    example_rows,
    reasoning,
    server_config,
    verify,
)
from nemo_gym_env.servers.reasoning_gym import app as app_module
from nemo_gym_env.servers.reasoning_gym import scripted, tasks
from nemo_gym_env.servers.reasoning_gym.make_dataset import make_row

NAME = "reasoning_gym"
HERE = Path(__file__).resolve().parent.parent
Server = app_module.ReasoningGymResourcesServer
ROWS = example_rows(HERE)
TIMEOUT_S = 4.0


def serve(**config: Any) -> TestClient:
    return app_client(Server, {"score_timeout_s": TIMEOUT_S, **config}, name=NAME)


@pytest.fixture(scope="module")
def client():
    with serve(scoring_workers=2) as c:
        yield c


def answer_of(row: dict[str, Any]) -> str:
    return scripted.correct_answer(row)


# ---- scripted play on the example rows --------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_play_gets_1(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, [], correct=True))
    assert result["reward"] == 1.0 and result["score"] == 1.0, result.get("failure_reason")
    assert result["task_name"] == row["task_name"]
    assert result["extracted_answer"] == answer_of(row)
    assert result["answer_source"] == "answer_tag"
    assert "failure_kind" not in result


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_play_gets_0(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, [], correct=False))
    assert result["reward"] == 0.0 and result["score"] == 0.0
    assert result["extracted_answer"] == scripted.wrong_answer(answer_of(row))
    assert "failure_kind" not in result


def test_verify_echoes_the_row(client: TestClient) -> None:
    row = ROWS[2]
    result = verify(client, row, scripted.scripted_action(row, []))
    for key in ("question", "task_name", "task_seed", "task_size", "task_index", "task_config"):
        assert result[key] == row[key]
    assert result["responses_create_params"]["input"][1]["content"] == row["question"]


def test_row_that_already_has_metrics_is_rescored(client: TestClient) -> None:
    row = {**ROWS[1], "reward": 0.0, "score": 0.0, "extracted_answer": "x", "failure_kind": "stale"}
    result = verify(client, row, scripted.scripted_action(ROWS[1], []))
    assert result["reward"] == 1.0 and result["extracted_answer"] == answer_of(ROWS[1])
    assert "failure_kind" not in result


# ---- rows the server cannot rebuild: reward 0 with a reason, never a 500 -------------------


def test_unknown_task_gets_0_with_reason(client: TestClient) -> None:
    row = {**ROWS[0], "task_name": "no_such_task"}
    result = verify(client, row, [assistant_message("<answer>1</answer>")])
    assert result["reward"] == 0.0
    assert result["failure_kind"] == "unknown_task"
    assert "no_such_task" in result["failure_reason"] and "--list" in result["failure_reason"]


def test_invalid_task_config_gets_0_with_reason(client: TestClient) -> None:
    row = {**ROWS[0], "task_config": {"no_such_setting": 1}}
    result = verify(client, row, [assistant_message("<answer>1</answer>")])
    assert (result["reward"], result["failure_kind"]) == (0.0, "invalid_task_config")
    assert "no_such_setting" in result["failure_reason"]


def test_edited_question_is_a_mismatch(client: TestClient) -> None:
    row = {**ROWS[1], "question": ROWS[1]["question"] + " (edited)"}
    result = verify(client, row, scripted.scripted_action(ROWS[1], []))
    assert (result["reward"], result["failure_kind"]) == (0.0, "task_mismatch")
    assert "regenerate" in result["failure_reason"]


def test_the_answer_shipped_in_a_row_is_not_trusted(client: TestClient) -> None:
    row = {**ROWS[0], "answer": "7", "metadata": {"source_dataset": "basic_arithmetic"}}
    assert verify(client, row, [assistant_message("<answer>7</answer>")])["reward"] == 0.0
    assert verify(client, row, [assistant_message(f"<answer>{answer_of(ROWS[0])}</answer>")])["reward"] == 1.0


# ---- answer extraction through the route ------------------------------------------------


def test_empty_output_gets_0(client: TestClient) -> None:
    result = verify(client, ROWS[0], [])
    assert (result["reward"], result["extracted_answer"], result["answer_source"]) == (0.0, None, None)
    assert verify(client, ROWS[0], [assistant_message("")])["reward"] == 0.0


def test_no_answer_tag_gets_0(client: TestClient) -> None:
    result = verify(client, ROWS[1], [assistant_message(f"The answer is {answer_of(ROWS[1])}.")])
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


def test_several_answer_tags_last_one_counts(client: TestClient) -> None:
    row, right = ROWS[1], answer_of(ROWS[1])
    wrong = scripted.wrong_answer(right)
    text = f"<answer>{wrong}</answer> wait, no: <answer>{right}</answer>"
    assert verify(client, row, [assistant_message(text)])["reward"] == 1.0
    text = f"<answer>{right}</answer> wait, no: <answer>{wrong}</answer>"
    assert verify(client, row, [assistant_message(text)])["reward"] == 0.0


def test_only_the_last_assistant_message_counts(client: TestClient) -> None:
    row, right = ROWS[1], answer_of(ROWS[1])
    output = [assistant_message(f"<answer>{right}</answer>"), assistant_message("Hope that helps.")]
    result = verify(client, row, output)
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


def test_answer_only_in_reasoning_gets_0(client: TestClient) -> None:
    row, right = ROWS[1], answer_of(ROWS[1])
    output = [reasoning(f"<answer>{right}</answer>"), assistant_message("I am not sure.")]
    result = verify(client, row, output)
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)
    assert verify(client, row, [reasoning(f"<answer>{right}</answer>")])["reward"] == 0.0


def test_boxed_fallback(client: TestClient) -> None:
    row, right = ROWS[1], answer_of(ROWS[1])
    result = verify(client, row, [assistant_message(f"So the total is \\boxed{{{right}}}.")])
    assert (result["reward"], result["answer_source"]) == (1.0, "boxed")


def test_unicode(client: TestClient) -> None:
    row, right = ROWS[3], answer_of(ROWS[3])
    text = f"🙂 Ünïcödé thinking… 答案是 <answer>{right}</answer> ✓"
    assert verify(client, row, [assistant_message(text)])["reward"] == 1.0
    result = verify(client, row, [assistant_message("<answer>ｎｏｒｅｍｏｐｙｈ \u202e\u0000</answer>")])
    assert result["reward"] == 0.0 and result["extracted_answer"].startswith("ｎｏｒｅｍｏｐｙｈ")


def test_enormous_output_is_bounded_in_time(client: TestClient) -> None:
    row, right = ROWS[1], answer_of(ROWS[1])
    junk = "{\\boxed{<answer>" * 400_000  # ~6.4 MB of half-open tags and braces
    started = time.perf_counter()
    assert verify(client, row, [assistant_message(junk + f"<answer>{right}</answer>")])["reward"] == 1.0
    assert verify(client, row, [assistant_message(junk)])["reward"] == 0.0
    result = verify(client, row, [assistant_message(f"<answer>{'9' * 6_000_000}</answer>")])
    assert (result["reward"], result["failure_kind"]) == (0.0, "answer_too_long")
    assert len(result["extracted_answer"]) == 20_000
    assert time.perf_counter() - started < 30.0  # three 6 MB bodies, parsed and echoed


# ---- malformed rows: 422 naming the field -----------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"task_name": None}, "task_name"),
        ({"task_seed": "0"}, "task_seed"),
        ({"task_index": -1}, "task_index"),
        ({"task_index": 1, "task_size": 1}, "task_index"),
        ({"task_size": 0}, "task_size"),
        ({"task_config": {"seed": 3}}, "seed"),
        ({"task_config": [1]}, "task_config"),
        ({"question": 12}, "question"),
    ],
)
def test_malformed_row_is_422(client: TestClient, change: dict[str, Any], field: str) -> None:
    row = {**ROWS[0], **change}
    row = {k: v for k, v in row.items() if v is not None}
    response = make_response([assistant_message("<answer>1</answer>")]).model_dump(mode="json")
    reply = client.post("/verify", json={**row, "response": response})
    assert reply.status_code == 422, reply.text
    assert "/verify" in reply.json()["error"] and field in reply.text


def test_verify_without_response_is_422(client: TestClient) -> None:
    reply = client.post("/verify", json=ROWS[0])
    assert reply.status_code == 422 and "response" in reply.json()["error"]


# ---- scoring off the event loop, with a timeout -------------------------------------------


def test_runaway_scorer_times_out_and_the_server_stays_responsive(client: TestClient) -> None:
    question = tasks.regenerate(tasks.TaskKey("countdown", 0, 1, "{}", 0))["question"]
    row = make_row("countdown", 0, 1, 0, question)
    results: list[dict[str, Any]] = []
    # sympy evaluates 9**9**9**9 forever: the worker must be killed at the timeout.
    hang = threading.Thread(
        target=lambda: results.append(verify(client, row, [assistant_message("<answer>9**9**9**9</answer>")]))
    )
    started = time.perf_counter()
    hang.start()
    time.sleep(0.5)
    probe = time.perf_counter()
    assert client.get("/").json() == {"status": "ok"}
    liveness_s = time.perf_counter() - probe
    hang.join(timeout=60)
    elapsed = time.perf_counter() - started
    assert results and results[0]["reward"] == 0.0
    assert results[0]["failure_kind"] == "score_timeout"
    assert elapsed < TIMEOUT_S + 10, elapsed
    assert liveness_s < 2.0, liveness_s
    # The killed worker was replaced: scoring goes on.
    right = tasks.regenerate(tasks.TaskKey.from_row(row))["answer"]
    assert verify(client, row, [assistant_message(f"<answer>{right}</answer>")])["reward"] == 1.0


# ---- other configurations -----------------------------------------------------------------


def test_answer_fallback_full_text_and_none() -> None:
    row, right = ROWS[1], answer_of(ROWS[1])
    with serve(scoring_workers=1, answer_fallback="full_text") as full:
        result = verify(full, row, [assistant_message(f"  {right}\n")])
        assert (result["reward"], result["answer_source"]) == (1.0, "full_text")
        assert verify(full, row, [assistant_message(f"\\boxed{{{right}}} is it")])["answer_source"] == "boxed"
        app = full.app
    with serve(scoring_workers=1, answer_fallback="none") as strict:
        result = verify(strict, row, [assistant_message(f"\\boxed{{{right}}}")])
        assert (result["reward"], result["extracted_answer"]) == (0.0, None)
    assert app is not None


def test_pool_stops_with_the_app() -> None:
    server = Server.from_config({"scoring_workers": 1}, name=NAME)
    with app_client(server):
        pool = server.scoring_pool()
        assert not pool.closed
    assert pool.closed


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="answer_fallback"):
        Server.from_config({"answer_fallback": "everything"}, name=NAME)
    with pytest.raises(ValueError, match="score_timeout_s"):
        Server.from_config({"score_timeout_s": 0}, name=NAME)


# ---- data, config -------------------------------------------------------------------------


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    assert len({row["task_name"] for row in ROWS}) == 5
    for row in ROWS:
        app_module.ReasoningGymRunRequest.model_validate(row)
        assert "answer" not in row and "metadata" not in row
        system, user = row["responses_create_params"]["input"]
        assert system["role"] == "system" and "<answer>" in system["content"]
        assert user == {"role": "user", "content": row["question"]}


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["verified"] is False and server["domain"] and server["description"]
    Server.from_config(server, name=NAME)  # every key is a valid setting


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert 'if __name__ == "__main__":\n    ReasoningGymResourcesServer.run_webserver()' in source
    assert "from nemo_gym_env." in source and "from ." not in source
