"""In-process tests of the ``badge_lookup`` server, its row generator and its scripted player."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import (
    app_client,
    assistant_message,
    example_rows,
    function_call,
    play,
    server_config,
    times_slower_than_plain,
    verify,
)
from nemo_gym_env.servers.badge_lookup import app as app_module
from nemo_gym_env.servers.badge_lookup import make_dataset as make_dataset_module
from nemo_gym_env.servers.badge_lookup import scripted
from nemo_gym_env.servers.badge_lookup.app import BadgeLookupServer, badge_number
from nemo_gym_env.servers.badge_lookup.make_dataset import make_dataset, people, split_of

NAME = "badge_lookup"
HERE = Path(__file__).resolve().parent.parent
ROWS = example_rows(HERE)


@pytest.fixture
def client():
    with app_client(BadgeLookupServer, {}, name=NAME) as c:
        yield c


def lookups(*names: str) -> list[dict]:
    return [function_call(i, 0, "lookup_badge", {"name": name}) for i, name in enumerate(names)]


def test_docstrings():
    for module in (app_module, make_dataset_module, scripted):
        assert doctest.testmod(module).failed == 0


def test_config_and_example_rows_are_the_generator_s():
    assert server_config(HERE, NAME)["domain"] == "knowledge"
    assert ROWS == make_dataset(5, seed=0, split="train")


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_play_scores_one_or_zero(client, index):
    assert play(client, ROWS[index], scripted.scripted_action, correct=True)["reward"] == 1.0
    assert play(client, ROWS[index], scripted.scripted_action, correct=False)["reward"] == 0.0


def test_the_tool_is_fixed_by_the_name(client):
    first = client.post("/lookup_badge", json={"name": "Ada Moreau"}).json()
    again = client.post("/lookup_badge", json={"name": "  ADA moreau "}).json()
    assert first["badge"] == again["badge"] == badge_number("Ada Moreau")
    assert 100 <= first["badge"] <= 999


@pytest.mark.parametrize("body", [{}, {"name": ""}, {"name": 7}, {"name": "x" * 201}, [], "Ada"])
def test_bad_tool_arguments_are_422(client, body):
    assert client.post("/lookup_badge", json=body).status_code == 422


def test_a_tool_body_that_is_not_json_is_422(client):
    reply = client.post("/lookup_badge", content=b"{not json", headers={"content-type": "application/json"})
    assert reply.status_code == 422


def test_right_answer_needs_the_lookups(client):
    row = {**make_dataset(2, seed=3, split="train")[1]}  # a "larger" row
    assert row["kind"] == "larger"
    a, b = row["names"]
    answer = assistant_message(f"\\boxed{{{row['expected_answer']}}}")
    both = verify(client, row, [*lookups(a, b), answer])
    assert both["reward"] == 1.0 and both["looked_up"] == 1.0 and both["num_tool_calls"] == 2
    one = verify(client, row, [*lookups(a), answer])
    assert one["reward"] == 0.0 and one["correct_answer"] and one["looked_up"] == 0.5
    guessed = verify(client, row, [answer])
    assert guessed["reward"] == 0.0 and guessed["looked_up"] == 0.0


def test_the_last_boxed_answer_of_the_last_message_counts(client):
    row = make_dataset(1, seed=4, split="heldout")[0]
    right, wrong = row["expected_answer"], str(int(row["expected_answer"]) % 999 + 1)
    calls = lookups(*row["names"])
    spaced = verify(client, row, [*calls, assistant_message(f"first \\boxed{{{wrong}}}, then \\boxed{{ {right} }}")])
    assert spaced["reward"] == 1.0 and spaced["answer"] == f" {right} "
    later_wrong = verify(client, row, [*calls, assistant_message(f"\\boxed{{{right}}}"),
                                       assistant_message(f"\\boxed{{{wrong}}}")])
    assert later_wrong["reward"] == 0.0
    unboxed = verify(client, row, [*calls, assistant_message(right)])
    assert unboxed["reward"] == 0.0 and not unboxed["answered"] and unboxed["answer"] is None


def test_broken_tool_call_arguments_do_not_count_as_lookups(client):
    row = make_dataset(1, seed=5, split="train")[0]
    broken = function_call(0, 0, "lookup_badge", "{not json")
    other = function_call(1, 0, "lookup_badge", json.dumps(["not", "an", "object"]))
    reply = verify(client, row, [broken, other, assistant_message(f"\\boxed{{{row['expected_answer']}}}")])
    assert reply["reward"] == 0.0 and reply["looked_up"] == 0.0 and reply["num_tool_calls"] == 2


@pytest.mark.parametrize("change", [{"names": []}, {"names": "Ada"}, {"expected_answer": None}, {"kind": 3}])
def test_bad_rows_are_422(client, change):
    response = make_response([]).model_dump(mode="json")
    assert client.post("/verify", json={**ROWS[0], "response": response}).status_code == 200
    reply = client.post("/verify", json={**ROWS[0], **change, "response": response})
    assert reply.status_code == 422, reply.text


def test_train_and_heldout_never_share_a_person():
    train, heldout = people("train"), people("heldout")
    assert not set(train) & set(heldout) and len(train) + len(heldout) == 1600
    assert all(split_of(name) == "train" for name in train)
    rows = make_dataset(500, seed=0, split="train") + make_dataset(500, seed=1, split="train")
    held = make_dataset(500, seed=0, split="heldout")
    assert not {n for r in rows for n in r["names"]} & {n for r in held for n in r["names"]}
    assert not {json.dumps(r, sort_keys=True) for r in rows} & {json.dumps(r, sort_keys=True) for r in held}


def test_rows_are_varied_and_balanced():
    rows = make_dataset(400, seed=2, split="heldout")
    assert [r["kind"] for r in rows[:4]] == ["single", "larger", "single", "larger"]
    assert len({r["responses_create_params"]["input"][-1]["content"] for r in rows}) > 300
    larger = [r for r in rows if r["kind"] == "larger"]
    first_wins = sum(r["expected_answer"] == r["names"][0] for r in larger) / len(larger)
    assert 0.35 < first_wins < 0.65  # answering the first name does not pay
    assert make_dataset(10, seed=2, split="heldout") == rows[:10]
    assert make_dataset(10, seed=3, split="heldout") != rows[:10]


def test_worked_examples_come_before_the_question_and_name_no_one_of_either_split():
    from nemo_gym_env.protocol.parser import parse_model_text
    from nemo_gym_env.servers.badge_lookup.make_dataset import SHOTS

    everyone = set(people("train")) | set(people("heldout"))
    lengths = []
    for shots in (0, 1, 2):
        row = make_dataset(1, seed=0, shots=shots)[0]
        messages = row["responses_create_params"]["input"]
        assert messages[0]["role"] == "system" and messages[-1]["content"].startswith("What is the badge")
        lengths.append(len(messages))
        assert messages[1:-1] == SHOTS[: len(messages) - 2]
    assert lengths == [2, 8, 12]  # 1 + (1 + 2 * lookups + 1) per example + 1
    for message in SHOTS:
        assert not any(name in message["content"] for name in everyone)
    turns = [parse_model_text(m["content"]) for m in SHOTS if m["role"] == "assistant"]
    calls = [[item["name"] for item in items if item["type"] == "function_call"] for items in turns]
    assert calls == [["lookup_badge"], ["lookup_badge"], [], ["lookup_badge"], []]  # the parser reads them back


@pytest.mark.parametrize("arguments", [{"size": -1}, {"size": 2, "split": "test"}, {"size": 2, "kinds": ["sum"]},
                                       {"size": 2, "kinds": []},
                                       {"size": 2, "shots": 3}, {"size": 2, "order": "random"}])
def test_bad_generator_arguments_are_refused(arguments):
    with pytest.raises(ValueError):
        make_dataset(**arguments)


def test_by_kind_order_is_the_same_rows_each_kind_together():
    mixed = make_dataset(10, 3, kinds=["single", "larger"])
    curriculum = make_dataset(10, 3, kinds=["single", "larger"], order="by_kind")
    assert [row["kind"] for row in curriculum] == ["single"] * 5 + ["larger"] * 5
    assert curriculum == [row for row in mixed if row["kind"] == "single"] + [
        row for row in mixed if row["kind"] == "larger"]
    assert [row["kind"] for row in make_dataset(4, 3, kinds=["larger", "single"], order="by_kind")] == [
        "larger", "larger", "single", "single"]


def test_the_command_line_writes_rows(tmp_path, capsys):
    out = tmp_path / "sub" / "rows.jsonl"
    assert make_dataset_module.main(["--size", "4", "--seed", "9", "--split", "heldout", "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == make_dataset(4, 9, "heldout")
    with pytest.raises(SystemExit) as refused:
        make_dataset_module.main(["--size", "-3"])
    assert refused.value.code == 2 and "size must be >= 0" in capsys.readouterr().err


def test_the_answer_reader_is_linear():
    assert times_slower_than_plain(app_module.final_answer, "\\boxed{" * 14_000) < 50


ANSWER_ROWS = make_dataset(6, seed=0, split="train", answer_tool=True)


@pytest.mark.parametrize("index", range(len(ANSWER_ROWS)))
def test_rows_with_the_answer_tool_play_through_it(client, index):
    row = ANSWER_ROWS[index]
    assert [t["name"] for t in row["responses_create_params"]["tools"]] == ["lookup_badge", "submit_answer"]
    assert play(client, row, scripted.scripted_action, correct=True)["reward"] == 1.0
    assert play(client, row, scripted.scripted_action, correct=False)["reward"] == 0.0


def test_the_answer_tool_takes_the_answer_and_the_verifier_reads_the_last_call(client):
    reply = client.post("/submit_answer", json={"answer": "417"})
    assert reply.status_code == 200 and reply.json() == {"answer": "417", "recorded": True}
    row = make_dataset(1, seed=4, split="heldout")[0]
    right, wrong = row["expected_answer"], str(int(row["expected_answer"]) % 999 + 1)
    calls = lookups(*row["names"])

    def submit(n: int, answer: str) -> dict:
        return function_call(n, 1, "submit_answer", {"answer": answer})

    # The submitted answer wins over a boxed one in the text, and the last submission counts.
    assert verify(client, row, [*calls, submit(5, right), assistant_message(f"\\boxed{{{wrong}}}")])["reward"] == 1.0
    assert verify(client, row, [*calls, submit(5, wrong), submit(6, f" {right} ")])["reward"] == 1.0
    last_wrong = verify(client, row, [*calls, submit(5, right), submit(6, wrong)])
    assert last_wrong["reward"] == 0.0 and last_wrong["answer"] == wrong
    # The lookups are still required; a submission that is not an object with a string answer does not count.
    assert verify(client, row, [submit(5, right)])["reward"] == 0.0
    broken = function_call(7, 1, "submit_answer", "{not json")
    assert verify(client, row, [*calls, broken, assistant_message(f"\\boxed{{{right}}}")])["reward"] == 1.0


@pytest.mark.parametrize("body", [{}, {"answer": 5}, {"answer": "x" * 201}, [], "417"])
def test_bad_answer_tool_arguments_are_422(client, body):
    assert client.post("/submit_answer", json=body).status_code == 422


def test_answer_tool_rows_ask_the_same_questions_with_examples_that_submit():
    from nemo_gym_env.protocol.parser import parse_model_text
    from nemo_gym_env.servers.badge_lookup.make_dataset import ANSWER_SHOTS, ANSWER_SYSTEM_PROMPT

    plain, tooled = make_dataset(20, seed=3, split="train"), make_dataset(20, seed=3, split="train", answer_tool=True)
    assert [r["names"] for r in plain] == [r["names"] for r in tooled]
    assert [r["expected_answer"] for r in plain] == [r["expected_answer"] for r in tooled]
    messages = tooled[0]["responses_create_params"]["input"]
    assert messages[0]["content"] == ANSWER_SYSTEM_PROMPT and messages[1:-1] == ANSWER_SHOTS
    turns = [parse_model_text(m["content"]) for m in ANSWER_SHOTS if m["role"] == "assistant"]
    calls = [[item["name"] for item in items if item["type"] == "function_call"] for items in turns]
    assert calls == [["lookup_badge"], ["lookup_badge"], ["submit_answer"], [], ["lookup_badge"], ["submit_answer"], []]
    assert "so the answer is Sam Berg." in turns_text(ANSWER_SHOTS)  # the answer's sentence before its call
    assert len(make_dataset(1, shots=1, answer_tool=True)[0]["responses_create_params"]["input"]) == 10


def turns_text(messages: list[dict]) -> str:
    return "\n".join(m["content"] for m in messages if m["role"] == "assistant")
