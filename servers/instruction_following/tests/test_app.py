"""Tests of the ``instruction_following`` server: each instruction, the verifier, the scripted player."""

from __future__ import annotations

import doctest
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

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
from nemo_gym_env.servers.instruction_following import app as app_module
from nemo_gym_env.servers.instruction_following import instructions, scripted

NAME = "instruction_following"
HERE = Path(__file__).resolve().parent.parent


Server = app_module.InstructionFollowingResourcesServer

ROWS = example_rows(HERE)

# Sample kwargs per instruction id: every registered id must have an entry.
SAMPLE_KWARGS: dict[str, dict[str, Any]] = {
    "length_constraints:number_words": {"relation": "at least", "num_words": 12},
    "length_constraints:number_sentences": {"relation": "less than", "num_sentences": 4},
    "length_constraints:number_paragraphs": {"num_paragraphs": 2},
    "length_constraints:nth_paragraph_first_word": {
        "num_paragraphs": 2,
        "nth_paragraph": 2,
        "first_word": "then",
    },
    "keywords:existence": {"keywords": ["harbour", "rope"]},
    "keywords:forbidden_words": {"forbidden_words": ["storm"]},
    "keywords:frequency": {"keyword": "boat", "frequency": 2, "relation": "at least"},
    "keywords:letter_frequency": {"letter": "q", "let_frequency": 3, "let_relation": "at least"},
    "detectable_format:json_format": {},
    "detectable_format:number_bullet_lists": {"num_bullets": 2},
    "detectable_format:number_highlighted_sections": {"num_highlights": 2},
    "detectable_format:multiple_sections": {"section_spliter": "PART", "num_sections": 2},
    "detectable_format:title": {},
    "detectable_format:constrained_response": {},
    "detectable_content:number_placeholders": {"num_placeholders": 2},
    "detectable_content:postscript": {"postscript_marker": "P.P.S"},
    "change_case:english_lowercase": {},
    "change_case:english_capital": {},
    "change_case:capital_word_frequency": {"capital_frequency": 2, "capital_relation": "at least"},
    "startend:end_checker": {"end_phrase": "Any other questions?"},
    "startend:quotation": {},
    "punctuation:no_comma": {},
    "combination:repeat_prompt": {"prompt_to_repeat": "Write a limerick about a cat."},
    "combination:two_responses": {},
}


@pytest.fixture
def client():
    with app_client(Server, name=NAME) as c:
        yield c


def row_with(ids: list[str], kwargs: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Answer."}], "tools": []},
        "instruction_id_list": ids,
        "kwargs": kwargs,
        **extra,
    }


def followed(instruction_id: str, kwargs: dict[str, Any] | None, text: str) -> bool:
    return instructions.build(instruction_id, kwargs).check(text).followed


# ---- each instruction -------------------------------------------------------------------------

CASES = [
    # (id, kwargs, text, followed)
    ("length_constraints:number_words", {"relation": "at least", "num_words": 3}, "one two three", True),
    ("length_constraints:number_words", {"relation": "at least", "num_words": 4}, "one two three", False),
    ("length_constraints:number_words", {"relation": "less than", "num_words": 3}, "one two", True),
    ("length_constraints:number_words", {"relation": "less than", "num_words": 3}, "one, two; three!", False),
    (
        "length_constraints:number_sentences",
        {"relation": "at least", "num_sentences": 3},
        "Go. Be? Yes!",
        True,
    ),
    (
        "length_constraints:number_sentences",
        {"relation": "less than", "num_sentences": 2},
        "Dr. Who came. Ok.",
        False,
    ),
    (
        "length_constraints:number_sentences",
        {"relation": "less than", "num_sentences": 2},
        "Mr. J. Smith paid 3.50 today.",
        True,
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "first\n***\nsecond", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "***\nfirst\n***\nsecond\n***\n", True),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "a\n***\n\n***\nb", False),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "***bold italic*** only", False),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "Then"},
        'Start.\n\n"Then" we left.',
        True,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "Start.\n\nNow we left.",
        False,
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 1, "first_word": "a"},
        "a\n\nb",
        False,
    ),
    ("keywords:existence", {"keywords": ["Rope", "harbour"]}, "The rope lay by the HARBOUR.", True),
    ("keywords:existence", {"keywords": ["rope"]}, "The ropes lay there.", False),
    ("keywords:forbidden_words", {"forbidden_words": ["storm"]}, "A stormy night.", True),
    ("keywords:forbidden_words", {"forbidden_words": ["storm"]}, "A Storm came.", False),
    ("keywords:frequency", {"keyword": "boat", "frequency": 2, "relation": "at least"}, "Boat, boat!", True),
    (
        "keywords:frequency",
        {"keyword": "boat", "frequency": 2, "relation": "less than"},
        "boat boathouse boats",
        True,
    ),
    ("keywords:frequency", {"keyword": "boat", "frequency": 2, "relation": "less than"}, "boat BOAT", False),
    (
        "keywords:letter_frequency",
        {"letter": "Q", "let_frequency": 2, "let_relation": "at least"},
        "quick Quiet",
        True,
    ),
    (
        "keywords:letter_frequency",
        {"letter": "q", "let_frequency": 2, "let_relation": "less than"},
        "quick quiet",
        False,
    ),
    ("detectable_format:json_format", {}, '{"a": [1, 2]}', True),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', True),
    ("detectable_format:json_format", {}, 'Here: {"a": 1}', False),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Intro\n* one\n- two\n***\n", True),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n* two\n* three", False),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", True),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "* bullet *one*\n** \n***",
        False,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nx\nSection 2\ny",
        True,
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1 only",
        False,
    ),
    ("detectable_format:title", None, "<<Poem of joy>>\ntext", True),
    ("detectable_format:title", None, "<< >> and <title>", False),
    ("detectable_format:constrained_response", None, "Hmm. My answer is maybe.", True),
    ("detectable_format:constrained_response", None, "my answer is yes", False),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "At [address] on [date].", True),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "At [address] on [ ].", False),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Body.\n\np. s. see you", True),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Body.\nP.P.S. more", True),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Body, P.S. inline", False),
    ("change_case:english_lowercase", None, "all lower, 123 ß straße", True),
    ("change_case:english_lowercase", None, "Not lower", False),
    ("change_case:english_lowercase", None, "123 !!!", False),
    ("change_case:english_capital", None, "ALL CAPS, 123 ÉTÉ", True),
    ("change_case:english_capital", None, "ALL CAPs", False),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "NASA and ESA",
        True,
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "less than"},
        "I think NASA",
        False,
    ),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. any other questions?  \n", True),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Bye.", False),
    ("startend:quotation", None, '  "Quoted answer."\n', True),
    ("startend:quotation", None, "\u201cCurly.\u201d", True),
    ("startend:quotation", None, '"Only at the start.', False),
    ("punctuation:no_comma", None, "No commas here.", True),
    ("punctuation:no_comma", None, "Full-width\uff0ccomma", False),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a  limerick."},
        "write a limerick.\nThere once...",
        True,
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a limerick."},
        "Sure! Write a limerick.",
        False,
    ),
    ("combination:two_responses", None, "First answer.\n******\nSecond answer.", True),
    ("combination:two_responses", None, "Same.\n******\nSame.", False),
    ("combination:two_responses", None, "One.\n******\n\n******\nTwo.", False),
    ("combination:two_responses", None, "Only one answer.", False),
]


@pytest.mark.parametrize(("instruction_id", "kwargs", "text", "expected"), CASES)
def test_instruction(instruction_id: str, kwargs: Any, text: str, expected: bool) -> None:
    check = instructions.build(instruction_id, kwargs).check(text)
    assert check.followed is expected, check.detail
    assert check.detail


def test_every_instruction_has_cases_both_ways() -> None:
    assert len(instructions.INSTRUCTIONS) >= 22
    assert set(SAMPLE_KWARGS) == set(instructions.INSTRUCTIONS)
    for instruction_id in instructions.INSTRUCTIONS:
        outcomes = {expected for i, _, _, expected in CASES if i == instruction_id}
        assert outcomes == {True, False}, instruction_id


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "fragment"),
    [
        ("no_such:instruction", {}, "unknown instruction id 'no_such:instruction'"),
        ("length_constraints:number_words", {"relation": "at most", "num_words": 3}, "relation"),
        ("length_constraints:number_words", {"relation": "at least"}, "num_words"),
        ("length_constraints:number_words", {"relation": "at least", "num_words": "many"}, "num_words"),
        ("length_constraints:number_words", {"relation": "at least", "num_words": -1}, "num_words"),
        ("punctuation:no_comma", {"comma": 1}, "comma"),
        (
            "keywords:letter_frequency",
            {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
            "letter",
        ),
        ("keywords:existence", {"keywords": []}, "keywords"),
        ("keywords:existence", {"keywords": "rope"}, "keywords"),
    ],
)
def test_build_refuses_bad_ids_and_kwargs(instruction_id: str, kwargs: Any, fragment: str) -> None:
    with pytest.raises(instructions.InstructionError, match=fragment):
        instructions.build(instruction_id, kwargs)


def test_null_kwargs_are_ignored() -> None:
    # The HF IFEval export fills every kwargs dict with all keys, null where unused.
    kwargs = {"relation": "at least", "num_words": 2, "keywords": None, "prompt_to_repeat": None}
    assert followed("length_constraints:number_words", kwargs, "two words")
    assert followed("detectable_format:title", None, "<<t>>")


@pytest.mark.parametrize("instruction_id", sorted(SAMPLE_KWARGS))
def test_scripted_composer_follows_each_instruction_alone(instruction_id: str) -> None:
    row = row_with([instruction_id], [SAMPLE_KWARGS[instruction_id]])
    text = scripted.compose(row)
    assert followed(instruction_id, SAMPLE_KWARGS[instruction_id], text), text
    assert not followed(instruction_id, SAMPLE_KWARGS[instruction_id], scripted.violate(row, text))


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("aZ *-#<>[]{}\"',.!?\n\t0\u00df\u4e2d\U0001f600")), max_size=400)
)
def test_no_instruction_raises_on_any_text(text: str) -> None:
    for instruction_id, kwargs in SAMPLE_KWARGS.items():
        check = instructions.build(instruction_id, kwargs).check(text)
        assert isinstance(check.followed, bool)


def test_unicode_words_and_case() -> None:
    assert instructions.count_words("日本語 emoji 😀 café") == 3
    assert followed("change_case:english_lowercase", None, "ça va très bien 😀")
    assert not followed("change_case:english_lowercase", None, "Ça va")
    assert followed("keywords:existence", {"keywords": ["café"]}, "Un CAFÉ, s'il vous plaît")


@pytest.mark.parametrize(
    "text",
    [
        "<<" * 100_000,
        "*" * 200_000,
        "[" * 200_000,
        "a." * 100_000,
        "\n\n" * 100_000,
        "P." * 100_000,
        "`" * 200_000,
    ],
)
def test_adversarial_texts_check_in_bounded_time(text: str) -> None:
    started = time.perf_counter()
    for instruction_id, kwargs in SAMPLE_KWARGS.items():
        instructions.build(instruction_id, kwargs).check(text)
    assert time.perf_counter() - started < 5.0


# ---- verify -----------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_correct_play_gets_1(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, []))
    assert result["reward"] == 1.0, result["instruction_results"]
    assert result["follow_all_instructions"] is True
    assert result["follow_instruction_list"] == [True] * len(row["instruction_id_list"])
    assert [r["id"] for r in result["instruction_results"]] == row["instruction_id_list"]
    assert "failure_kind" not in result


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_wrong_play_gets_0(client: TestClient, index: int) -> None:
    row = ROWS[index]
    result = verify(client, row, scripted.scripted_action(row, [], correct=False))
    assert result["reward"] == 0.0
    assert result["follow_all_instructions"] is False
    assert "failure_kind" not in result


def test_fraction_mode_from_config_and_row_override() -> None:
    row = row_with(
        ["punctuation:no_comma", "detectable_format:title", "startend:quotation"], [None, None, None]
    )
    output = [assistant_message("<<t>> no commas here")]
    with app_client(Server, {"grading_mode": "fraction"}, name=NAME) as c:
        result = verify(c, row, output)
        assert result["reward"] == pytest.approx(2 / 3) and result["grading_mode"] == "fraction"
        assert result["follow_instruction_list"] == [True, True, False]
        assert verify(c, {**row, "grading_mode": "binary"}, output)["reward"] == 0.0
    with app_client(Server, name=NAME) as c:
        assert verify(c, row, output)["reward"] == 0.0
        result = verify(c, {**row, "grading_mode": "fraction"}, output)
        assert result["reward"] == pytest.approx(2 / 3) and result["follow_all_instructions"] is False


def test_instruction_results_carry_details(client: TestClient) -> None:
    row = row_with(["length_constraints:number_words"], [{"relation": "less than", "num_words": 3}])
    result = verify(client, row, [assistant_message("one two three four")])
    assert result["instruction_results"] == [
        {"id": "length_constraints:number_words", "followed": False, "detail": "4 words; needs less than 3"}
    ]


def test_unknown_instruction_is_reward_0_with_reason_not_500(client: TestClient) -> None:
    row = row_with(["punctuation:no_comma", "language:response_language"], [None, {"language": "fr"}])
    result = verify(client, row, [assistant_message("no commas")])
    assert result["reward"] == 0.0
    assert result["failure_kind"] == "invalid_instruction"
    assert "language:response_language" in result["failure_reason"]
    assert result["follow_instruction_list"] == [True, False]
    assert result["instruction_results"][1]["detail"] == "invalid instruction"


def test_bad_kwargs_are_reward_0_with_reason(client: TestClient) -> None:
    row = row_with(["length_constraints:number_words"], [{"relation": "about", "num_words": 3}])
    result = verify(client, row, [assistant_message("one two")])
    assert (result["reward"], result["failure_kind"]) == (0.0, "invalid_instruction")
    assert (
        "length_constraints:number_words" in result["failure_reason"]
        and "relation" in result["failure_reason"]
    )


@pytest.mark.parametrize(
    "output",
    [
        [],
        [assistant_message("")],
        [assistant_message("   \n")],
        [reasoning("no commas here")],
        [function_call(0, 0, "x", {})],
    ],
)
def test_no_answer_is_reward_0(client: TestClient, output: list[dict[str, Any]]) -> None:
    row = row_with(["punctuation:no_comma"], [None])
    result = verify(client, row, output)
    assert (result["reward"], result["failure_kind"]) == (0.0, "no_answer")
    assert result["follow_instruction_list"] == [False]


def test_only_the_last_assistant_message_counts(client: TestClient) -> None:
    row = row_with(["punctuation:no_comma"], [None])
    with_comma, without = assistant_message("a, b", "m1"), assistant_message("ab", "m2")
    assert verify(client, row, [with_comma, without, reasoning("a, b")])["reward"] == 1.0
    without, with_comma = assistant_message("ab", "m1"), assistant_message("a, b", "m2")
    assert verify(client, row, [without, with_comma])["reward"] == 0.0


def test_message_parts_are_joined(client: TestClient) -> None:
    row = row_with(["startend:quotation"], [None])
    item = assistant_message('"first')
    item["content"].append({"type": "output_text", "text": ' second"', "annotations": []})
    assert verify(client, row, [item])["reward"] == 1.0


def test_enormous_answer_is_refused_in_bounded_time(client: TestClient) -> None:
    row = row_with(["length_constraints:number_words"], [{"relation": "at least", "num_words": 1}])
    started = time.perf_counter()
    result = verify(client, row, [assistant_message("word " * 2_000_000)])  # 10 MB
    assert time.perf_counter() - started < 30.0
    assert (result["reward"], result["failure_kind"]) == (0.0, "response_too_long")
    assert "max_response_chars=200000" in result["failure_reason"]


def test_max_response_chars_is_configurable() -> None:
    row = row_with(["punctuation:no_comma"], [None])
    with app_client(Server, {"max_response_chars": 10}, name=NAME) as c:
        assert verify(c, row, [assistant_message("short")])["reward"] == 1.0
        assert verify(c, row, [assistant_message("longer than ten")])["failure_kind"] == "response_too_long"


def test_unicode_answer(client: TestClient) -> None:
    row = row_with(["keywords:existence", "punctuation:no_comma"], [{"keywords": ["東京"]}, None])
    assert verify(client, row, [assistant_message("私は 東京 が好きです。😀")])["reward"] == 1.0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kwargs": [None]}, "kwargs"),
        ({"instruction_id_list": []}, "instruction_id_list"),
        ({"instruction_id_list": "punctuation:no_comma"}, "instruction_id_list"),
        ({"instruction_id_list": None}, "instruction_id_list"),
        ({"kwargs": "none"}, "kwargs"),
        ({"kwargs": [None, 3]}, "kwargs"),
        ({"grading_mode": "partial"}, "grading_mode"),
    ],
)
def test_malformed_row_is_422(client: TestClient, change: dict[str, Any], field: str) -> None:
    row = {**row_with(["punctuation:no_comma", "detectable_format:title"], [None, {}]), **change}
    reply = client.post(
        "/verify", json={**row, "response": make_response([assistant_message("x")]).model_dump(mode="json")}
    )
    assert reply.status_code == 422
    assert field in reply.text and "/verify" in reply.json()["error"]


def test_missing_fields_are_422(client: TestClient) -> None:
    row = {k: v for k, v in ROWS[0].items() if k != "kwargs"}
    reply = client.post(
        "/verify", json={**row, "response": make_response([assistant_message("x")]).model_dump(mode="json")}
    )
    assert reply.status_code == 422 and "kwargs" in reply.json()["error"]


def test_verify_echoes_the_row_and_drops_stale_failures(client: TestClient) -> None:
    row = {**ROWS[1], "failure_kind": "no_answer", "failure_reason": "old", "reward": 0.0}
    result = verify(client, row, scripted.scripted_action(ROWS[1], []))
    assert result["reward"] == 1.0 and "failure_kind" not in result and "failure_reason" not in result
    for key in ("id", "prompt", "instruction_id_list", "kwargs"):
        assert result[key] == ROWS[1][key]


def test_seed_session_and_liveness(client: TestClient) -> None:
    assert client.post("/seed_session", json=ROWS[0]).status_code == 200
    assert client.get("/").json() == {"status": "ok"}


# ---- data, config, modules --------------------------------------------------------------------


def test_example_rows_are_valid() -> None:
    assert len(ROWS) == 5
    assert [row["id"] for row in ROWS] == list(range(5))
    for row in ROWS:
        app_module.InstructionFollowingRunRequest.model_validate(row)
        assert row["responses_create_params"]["input"][0]["content"] == row["prompt"]
        for instruction_id, kwargs in zip(row["instruction_id_list"], row["kwargs"]):
            instructions.build(instruction_id, kwargs)


def test_config_names_the_instance() -> None:
    server = server_config(HERE, NAME)
    assert server["entrypoint"] == "app.py"
    assert server["domain"] and server["description"]
    app_module.InstructionFollowingResourcesServerConfig.model_validate(server)


@pytest.mark.parametrize("module", [instructions, scripted])
def test_doctests(module: Any) -> None:
    assert doctest.testmod(module).failed == 0


def test_app_module_runs_as_a_script() -> None:
    source = (HERE / "app.py").read_text()
    assert source.rstrip().endswith(
        'if __name__ == "__main__":\n    InstructionFollowingResourcesServer.run_webserver()'
    )
    assert "from nemo_gym_env." in source and "from ." not in source


@pytest.mark.slow
def test_launched_server_over_http() -> None:
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher() as launcher:
        process = launcher.start(bundled_spec(NAME))
        with httpx.Client(base_url=process.url, timeout=30) as http:
            for row in ROWS:
                for correct in (True, False):
                    body = {
                        **row,
                        "response": make_response(
                            scripted.scripted_action(row, [], correct=correct)
                        ).model_dump(mode="json"),
                    }
                    reply = http.post("/verify", json=body)
                    assert reply.status_code == 200 and reply.json()["reward"] == float(correct)
            assert http.get("/").json() == {"status": "ok"}


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
