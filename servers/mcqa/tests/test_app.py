"""Tests of the ``mcqa`` server: grading modes, row regexes, malformed rows, adversarial answers."""

from __future__ import annotations

import doctest
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

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
from nemo_gym_env.servers.mcqa import choices, scripted
from nemo_gym_env.servers.mcqa.app import MCQAResourcesServer, MCQARunRequest

NAME = "mcqa"
HERE = Path(__file__).resolve().parent.parent
ROWS = example_rows(HERE)
OPTIONS = {"A": "Venus", "B": "Mercury", "C": "Mars", "D": "Earth"}
PLAIN = {k: v for k, v in ROWS[0].items() if k not in ("grading_mode", "template_metadata")}  # expects B


def graded(client: TestClient, mode: str | None, text: str, **row: Any) -> dict[str, Any]:
    body = {**PLAIN, **row}
    if mode is not None:
        body["grading_mode"] = mode
    return verify(client, body, [assistant_message(text)])


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with app_client(MCQAResourcesServer, {"regex_timeout_s": 2.0}, name=NAME) as c:
        yield c


# ---- the readers (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"So \boxed{B}.", "B"),
        (r"\boxed{ (C) }", "C"),
        (r"\boxed {D}", "D"),
        (r"\boxed{B} or maybe \boxed{C}", None),  # two boxes: strict fails
        (r"\boxed{b}", None),  # lowercase
        (r"\boxed{\text{B}}", None),  # other letters in the box
        (r"\boxed{Z}", None),  # not an option
        (r"\boxed{BC}", None),
        ("B", None),
        ("", None),
    ],
)
def test_strict_single_letter_boxed(text: str, expected: str | None) -> None:
    assert choices.strict_boxed_letter(text, OPTIONS) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{A} hmm, no: \boxed{B}", "B"),
        (r"\boxed{\text{C}}", "C"),
        (r"\boxed{\textbf{(d)}}", "D"),
        (r"\boxed{B) Mercury}", "B"),
        (r"\boxed{mercury}", "B"),  # an option's text
        (r"\boxed{C} then \boxed{I am not sure}", "C"),  # the last box that names an option
        (r"\boxed{A large planet}", None),
        ("Answer: B", None),
    ],
)
def test_lenient_boxed(text: str, expected: str | None) -> None:
    assert choices.lenient_boxed_letter(text, OPTIONS) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: B", "B"),
        ("answer: c", "C"),
        ("**Answer:** (D)", "D"),
        ("**Answer**: A", "A"),
        ("Answer: B\n...\nFinal answer: C.", "C"),  # last occurrence
        ("Answer: C\nAnswer: I am unsure", None),  # the last one decides
        ("ANSWER： Mars", "C"),  # full-width colon, option text
        (r"Answer: $\boxed{A}$", "A"),
        ("Answer: A large planet", None),
        ("The answer is B", None),
    ],
)
def test_lenient_answer_colon(text: str, expected: str | None) -> None:
    assert choices.answer_colon_letter(text, OPTIONS) == expected


def test_option_shapes() -> None:
    assert choices.option_letters([{"A": "x"}, {"b": "y"}, {"C": None}]) == {"A": "x", "B": "y"}
    assert choices.option_letters({"A": "x", "B": "y"}) == {"A": "x", "B": "y"}
    with pytest.raises(ValueError, match="single letter"):
        choices.option_letters({"AB": "x"})
    with pytest.raises(ValueError, match="twice"):
        choices.option_letters([{"A": "x"}, {"a": "y"}])


def _read_all(text: str) -> None:
    for read in (choices.strict_boxed_letter, choices.lenient_boxed_letter, choices.answer_colon_letter):
        read(text, OPTIONS)


def test_readers_are_linear_on_adversarial_text() -> None:
    """Adversarial text is read in linear time, timed against plain text of the same length (a ratio taken
    side by side: quadratic backtracking on 100k characters would be thousands of times slower).
    These readers do real work at every ``\\boxed{`` (about 30x plain text on a quiet machine, over
    50x on a busy one), so the bound is 200: still far below what a quadratic reader scores."""
    for text in [
        "\\boxed{" * 15_000,
        "\\boxed{\\text{" * 8_000 + "}" * 16_000,
        "Answer: " * 12_000,
        "{}" * 50_000,
    ]:
        assert times_slower_than_plain(_read_all, text[-100_000:]) < 200


# ---- /verify ----------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_answer_gets_1(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, [], correct=True))
    assert result["reward"] == 1.0 and result["extracted_answer"] == row["expected_answer"]
    assert result["grading_mode"] == row.get("grading_mode", "strict_single_letter_boxed")
    assert result["answer_source"] == ("output_regex" if "template_metadata" in row else "grading_mode")


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_answer_gets_0(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, [], correct=False))
    assert result["reward"] == 0.0 and result["extracted_answer"] == scripted.wrong_letter(row)


def test_modes_through_the_route(client: TestClient) -> None:
    assert graded(client, None, r"\boxed{B}")["reward"] == 1.0
    several = graded(client, "strict_single_letter_boxed", r"\boxed{A} \boxed{B}")
    assert (several["reward"], several["extracted_answer"]) == (0.0, None)
    assert graded(client, "lenient_boxed", r"\boxed{A} \boxed{B}")["reward"] == 1.0
    assert graded(client, "lenient_boxed", r"\boxed{\text{b}}")["reward"] == 1.0
    assert graded(client, "lenient_answer_colon", "answer: A\nanswer: b")["reward"] == 1.0
    assert graded(client, "lenient_answer_colon", r"\boxed{B}")["reward"] == 0.0


def test_row_grading_mode_overrides_the_config() -> None:
    server = MCQAResourcesServer.from_config({"grading_mode": "lenient_answer_colon"}, name=NAME)
    with app_client(server) as c:
        by_config = graded(c, None, "Answer: B")
        assert (by_config["reward"], by_config["grading_mode"]) == (1.0, "lenient_answer_colon")
        by_row = graded(c, "strict_single_letter_boxed", "Answer: B")
        assert (by_row["reward"], by_row["grading_mode"]) == (0.0, "strict_single_letter_boxed")


@pytest.mark.parametrize(
    "output",
    [[], [assistant_message("")], [assistant_message("I believe it is the smallest planet.")]],
    ids=["empty-output", "empty-text", "no-answer"],
)
def test_no_answer_gets_0(client: TestClient, output: list[dict[str, Any]]) -> None:
    result = verify(client, PLAIN, output)
    assert (result["reward"], result["extracted_answer"], result["answer_source"]) == (0.0, None, None)
    assert "failure_reason" not in result


def test_answer_only_in_reasoning_gets_0(client: TestClient) -> None:
    result = verify(client, PLAIN, [reasoning(r"\boxed{B}"), assistant_message("As I reasoned.")])
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


def test_only_the_last_assistant_message_counts(client: TestClient) -> None:
    output = [assistant_message(r"\boxed{B}", "m1"), assistant_message("Let me reconsider.", "m2")]
    result = verify(client, PLAIN, output)
    assert result["reward"] == 0.0


def test_no_assistant_message_at_all(client: TestClient) -> None:
    output = [
        {"type": "message", "role": "user", "content": r"\boxed{B}"},
        {"type": "function_call", "call_id": "c", "name": "lookup", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c", "output": r"\boxed{B}"},
    ]
    result = verify(client, PLAIN, output)
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


def test_unicode(client: TestClient) -> None:
    assert graded(client, None, "水星 ☿ est la planète la plus rapide — \\boxed{B} ✅")["reward"] == 1.0
    assert graded(client, "lenient_answer_colon", "答案 🚀\nAnswer： B")["reward"] == 1.0
    assert graded(client, "lenient_boxed", "\\boxed{Ｂ}")["reward"] == 0.0  # a full-width letter is not B


@pytest.mark.slow
def test_enormous_output_is_bounded(client: TestClient) -> None:
    padding = "Considering each option in turn. " * 160_000  # ~5 MB
    started = time.monotonic()
    tail = graded(client, None, padding + r"\boxed{B}")
    head = graded(client, None, r"\boxed{B} " + padding)
    regex = verify(client, ROWS[4], [assistant_message(padding + r"Answer: \boxed{C}")])
    braces = graded(client, "lenient_boxed", "\\boxed{" * 700_000)
    assert time.monotonic() - started < 60
    assert (tail["reward"], tail["answer_truncated"]) == (1.0, True)
    assert (head["reward"], head["extracted_answer"], head["answer_truncated"]) == (0.0, None, True)
    assert (regex["reward"], regex["answer_source"]) == (1.0, "output_regex")
    assert braces["reward"] == 0.0


# ---- row regexes -------------------------------------------------------------------------


def with_regex(pattern: Any, **row: Any) -> dict[str, Any]:
    return {**PLAIN, "template_metadata": {"template_id": "t", "output_regex": pattern}, **row}


def test_row_regex_first_group_is_the_letter(client: TestClient) -> None:
    row = with_regex(r"Final choice:\s*\(?([A-D])\)?")
    result = verify(client, row, [assistant_message("Final choice: (A)\n...\nfinal CHOICE: b")])
    assert (result["reward"], result["answer_source"], result["extracted_answer"]) == (
        1.0,
        "output_regex",
        "B",
    )
    assert result["template_metadata"]["template_id"] == "t"  # echoed


def test_row_regex_list_and_fallback_to_the_mode(client: TestClient) -> None:
    row = with_regex([r"Option Selected:\s*([A-Z])", r"I pick\s+([A-Z])"])
    assert verify(client, row, [assistant_message("I pick B")])["answer_source"] == "output_regex"
    fallback = verify(client, row, [assistant_message(r"No match, but \boxed{B}")])
    assert (fallback["reward"], fallback["answer_source"]) == (1.0, "grading_mode")
    not_an_option = verify(client, row, [assistant_message(r"I pick Z \boxed{B}")])
    assert (not_an_option["reward"], not_an_option["answer_source"]) == (1.0, "grading_mode")


def test_row_regex_sees_only_the_last_20k_chars(client: TestClient) -> None:
    row = with_regex(r"Pick:\s*([A-D])")
    result = verify(client, row, [assistant_message("Pick: B " + "x" * 25_000)])
    assert (result["reward"], result["extracted_answer"]) == (0.0, None)


@pytest.mark.slow
def test_catastrophic_row_regex_times_out_and_the_mode_decides() -> None:
    server = MCQAResourcesServer.from_config({"regex_timeout_s": 1.0}, name=NAME)
    row = with_regex(r"(a+)+$")
    text = "a" * 5_000 + "!" + r" \boxed{B}"
    with app_client(server) as c:
        verify(c, with_regex(r"([A-D])"), [assistant_message("B")])  # starts the worker
        started = time.monotonic()
        result = verify(c, row, [assistant_message(text)])
        assert time.monotonic() - started < 1.0 + 3.0
        assert (result["reward"], result["answer_source"]) == (1.0, "grading_mode")
        assert "regex_timeout_s=1" in result["regex_error"]
        quick = verify(c, with_regex(r"([A-D])"), [assistant_message("B")])  # a fresh worker takes over
        assert (quick["reward"], quick["answer_source"], quick["regex_error"]) == (1.0, "output_regex", None)


# ---- malformed rows ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"options": None}, "options"),
        ({"options": "A: Venus, B: Mercury"}, "options"),
        ({"options": [{"AB": "Venus"}]}, "single letter"),
        ({"options": {}}, "no option"),
        ({"expected_answer": None}, "expected_answer"),
        ({"expected_answer": "E"}, "not one of the options"),
        ({"expected_answer": ""}, "not one of the options"),
        ({"grading_mode": "lenient_everything"}, "grading_mode"),
        ({"template_metadata": {"output_regex": "x" * 501}}, "at most 500"),
        ({"template_metadata": {"output_regex": "(unclosed"}}, "not a valid regex"),
        ({"template_metadata": {"output_regex": 5}}, "output_regex"),
    ],
)
def test_malformed_rows_are_422(client: TestClient, change: dict[str, Any], field: str) -> None:
    body = {**PLAIN, "response": make_response([assistant_message(r"\boxed{B}")]).model_dump(mode="json")}
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    reply = client.post("/verify", json=body)
    assert reply.status_code == 422
    assert "/verify" in reply.json()["error"] and field in reply.text


def test_no_tool_routes(client: TestClient) -> None:
    server = MCQAResourcesServer.from_config({}, name=NAME)
    assert server.tool_names(server.setup_webserver()) == []
    assert client.get("/").json() == {"status": "ok"}


# ---- data, config, scripted --------------------------------------------------------------


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    modes = set()
    for row in ROWS:
        MCQARunRequest.model_validate(row)
        modes.add(row.get("grading_mode"))
        prompt = row["responses_create_params"]["input"][0]["content"]
        for letter, text in choices.option_letters(row["options"]).items():
            assert f"\n{letter}: {text}" in prompt
    assert {"strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", None} <= modes
    # NeMo Gym's shape (a list of one-key dicts) in every row, so NeMo Gym's mcqa takes them too;
    # the letter -> text dict is still accepted.
    assert all(isinstance(row["options"], list) and all(len(o) == 1 for o in row["options"]) for row in ROWS)
    as_dict = {k: v for option in ROWS[0]["options"] for k, v in option.items()}
    assert MCQARunRequest.model_validate({**ROWS[0], "options": as_dict}).letters() == choices.option_letters(
        ROWS[0]["options"])
    assert any("template_metadata" in row for row in ROWS)


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["grading_mode"] is None and server["description"]
    MCQAResourcesServer.from_config(server, name=NAME)


def test_doctests() -> None:
    for module in (choices, scripted):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert 'if __name__ == "__main__":\n    MCQAResourcesServer.run_webserver()' in source
    assert "from nemo_gym_env." in source and "from ." not in source


@pytest.mark.slow
def test_gymnasium_episode() -> None:
    import gymnasium as gym

    import nemo_gym_env  # noqa: F401  (registers the ids)

    env = gym.make("NemoGym/mcqa-v0")
    try:
        for index in range(len(ROWS)):
            _, info = env.reset(options={"task_index": index})
            assert info["tools"] == []
            row = env.unwrapped.task
            _, reward, terminated, truncated, info = env.step(scripted.scripted_action(row, []))
            assert (reward, terminated, truncated) == (1.0, True, False)
    finally:
        env.close()
