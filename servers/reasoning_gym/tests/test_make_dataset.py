"""The row generator, task regeneration and the scripted player."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from nemo_gym_env.servers.reasoning_gym import make_dataset as make_dataset_module
from nemo_gym_env.servers.reasoning_gym import pool, scripted, tasks
from nemo_gym_env.servers.reasoning_gym.make_dataset import make_dataset

HERE = Path(__file__).resolve().parent.parent
EXAMPLE_ARGS = {
    "task_names": ["basic_arithmetic", "leg_counting", "ransom_note", "spell_backward", "knights_knaves"],
    "size": 5,
    "seed": 0,
    "config": {"basic_arithmetic": {"max_terms": 3, "max_digits": 2}},
}
# Tasks whose questions depend on the interpreter's hash seed (they iterate over sets).
HASH_SEED_SENSITIVE = ["ransom_note", "isomorphic_strings", "polynomial_multiplication"]


def test_example_data_is_what_the_generator_writes() -> None:
    rows = [
        json.loads(line)
        for line in (HERE / "data" / "example.jsonl").read_text().splitlines()
        if line.strip()
    ]
    # The bundled rows also carry NeMo Gym's answer and metadata (see the README); the rest is the generator's.
    assert make_dataset(**EXAMPLE_ARGS) == [{k: v for k, v in row.items() if k not in ("answer", "metadata")}
                                            for row in rows]


def test_rows_take_turns_and_name_their_entry() -> None:
    rows = make_dataset(["basic_arithmetic", "leg_counting", "word_sorting"], size=8, seed=5)
    assert [r["task_name"] for r in rows[:3]] == ["basic_arithmetic", "leg_counting", "word_sorting"]
    assert [r["task_index"] for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [r["task_size"] for r in rows[:3]] == [3, 3, 2]
    assert {r["task_seed"] for r in rows} == {5}
    for row in rows:
        entry = tasks.regenerate(tasks.TaskKey.from_row(row))
        assert entry["question"] == row["question"] == row["responses_create_params"]["input"][1]["content"]
        assert "answer" not in row


def test_same_name_seed_index_same_question() -> None:
    key = tasks.TaskKey("basic_arithmetic", seed=17, size=10, config="{}", index=3)
    first = tasks.regenerate(key)
    assert tasks.regenerate(key) == first
    assert make_dataset(["basic_arithmetic"], size=10, seed=17)[3]["question"] == first["question"]
    assert make_dataset(["basic_arithmetic"], size=10, seed=18)[3]["question"] != first["question"]
    assert (
        tasks.regenerate(tasks.TaskKey("basic_arithmetic", 17, 10, "{}", 4))["question"] != first["question"]
    )


def test_generation_ignores_this_process_hash_seed(tmp_path: Path) -> None:
    """The CLI in a process with another hash seed writes the same rows as this process."""
    out = tmp_path / "rows.jsonl"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    names = ",".join(HASH_SEED_SENSITIVE)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nemo_gym_env.servers.reasoning_gym.make_dataset",
            "--tasks",
            names,
            "--size",
            "6",
            "--seed",
            "3",
            "--out",
            str(out),
        ],
        check=True,
        env=env,
        timeout=300,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == make_dataset(HASH_SEED_SENSITIVE, size=6, seed=3)


def test_a_thousand_rows_quickly(capsys: pytest.CaptureFixture[str]) -> None:
    tasks.shared_pool()  # worker start-up is not generation
    started = time.perf_counter()
    rows = make_dataset(["basic_arithmetic", "leg_counting"], size=1000, seed=0)
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(f"\n[reasoning_gym] make_dataset: 1000 rows in {elapsed:.2f} s")
    assert len(rows) == 1000 and len({r["question"] for r in rows}) > 900
    assert elapsed < 60.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"task_names": [], "size": 1, "seed": 0}, "at least one"),
        ({"task_names": ["leg_counting", "leg_counting"], "size": 1, "seed": 0}, "repeat"),
        ({"task_names": ["no_such_task"], "size": 1, "seed": 0}, "no_such_task"),
        ({"task_names": ["leg_counting"], "size": -1, "seed": 0}, "size"),
        ({"task_names": ["leg_counting"], "size": 1, "seed": 0, "config": {"max_terms": 3}}, "task names"),
        (
            {"task_names": ["leg_counting"], "size": 1, "seed": 0, "config": {"leg_counting": {"seed": 1}}},
            "seed",
        ),
        (
            {"task_names": ["leg_counting"], "size": 1, "seed": 0, "config": {"leg_counting": {"bogus": 1}}},
            "bogus",
        ),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_dataset(**kwargs)


def test_config_must_be_a_mapping() -> None:
    with pytest.raises(TypeError, match="mapping"):
        make_dataset(["leg_counting"], size=1, seed=0, config={"leg_counting": 5})


def test_cli_list_and_errors() -> None:
    assert make_dataset_module.main(["--list"]) == 0
    with pytest.raises(SystemExit):
        make_dataset_module.main(["--size", "3"])
    with pytest.raises(SystemExit):
        make_dataset_module.main(["--tasks", "leg_counting", "--config", "{not json"])
    with pytest.raises(SystemExit):
        make_dataset_module.main(["--tasks", "leg_counting", "--config", '{"leg_counting": 5}'])


def test_size_is_part_of_a_row_identity() -> None:
    """acre writes different items for different dataset sizes, so rows keep task_size."""
    small = tasks.regenerate(tasks.TaskKey("acre", 0, 1, "{}", 0))
    large = tasks.regenerate(tasks.TaskKey("acre", 0, 40, "{}", 0))
    assert small["question"] != large["question"]


@pytest.mark.parametrize(
    ("answer", "wrong"),
    [("41", "42"), ("-1", "0"), ("True", "False"), ("no", "yes"), ("Paris", "∅"), ("∅", "0")],
)
def test_wrong_answer(answer: str, wrong: str) -> None:
    assert scripted.wrong_answer(answer) == wrong
    assert answer not in scripted.wrong_answer(answer)


def test_scripted_player_answers_in_one_message() -> None:
    row = make_dataset(["leg_counting"], size=1, seed=0)[0]
    [item] = scripted.scripted_action(row, [])
    assert item["type"] == "message" and item["role"] == "assistant"
    answer = tasks.regenerate(tasks.TaskKey.from_row(row))["answer"]
    assert item["content"][0]["text"] == f"<answer>{answer}</answer>"
    assert scripted.scripted_action(row, [], correct=False)[0]["content"][0]["text"] == (
        f"<answer>{scripted.wrong_answer(answer)}</answer>"
    )


@pytest.mark.parametrize("module", [scripted, tasks, make_dataset_module, pool])
def test_doctests(module) -> None:
    assert doctest.testmod(module).failed == 0
