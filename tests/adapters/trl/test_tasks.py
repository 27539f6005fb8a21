"""The training dataset and the task behind a prompt (``nemo_gym_env.adapters.trl.tasks``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

import nemo_gym_env  # noqa: F401  (registers the ids)
from nemo_gym_env.adapters.trl import TASK_ROW_FIELD, env_rows, tasks_dataset

from ..conftest import secret_rows

# ---- tasks_dataset --------------------------------------------------------------------------------


def test_tasks_dataset_from_every_kind_of_source(rows_file):
    by_id = tasks_dataset("NemoGym/example_multi_step-v0")
    by_name = tasks_dataset("example_multi_step")
    assert by_id["task"] == by_name["task"]
    assert len(by_id) == len(env_rows("NemoGym/example_multi_step-v0"))
    first = by_id[0]
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    assert json.loads(first["task"]) == env_rows("example_multi_step")[0]
    assert first["prompt"][0][TASK_ROW_FIELD] == first["task"] and first["prompt"][1][TASK_ROW_FIELD] is None

    from_rows = tasks_dataset(secret_rows())
    from_file = tasks_dataset(str(rows_file))
    generic = tasks_dataset("NemoGym/Generic-v0", dataset=str(rows_file))
    assert from_rows["task"] == from_file["task"] == generic["task"]
    assert [m["role"] for m in from_rows[0]["prompt"]][-2:] == ["assistant", "user"]
    assert from_rows["task_index"] == [0, 1]


def test_tasks_dataset_names_what_it_cannot_read():
    with pytest.raises(ValueError, match="default dataset"):
        tasks_dataset("NemoGym/Generic-v0")
    with pytest.raises(ValueError, match="neither a registered env id"):
        tasks_dataset("no_such_thing")
