"""Task rows read and checked, with line numbers: pure functions on files."""

from __future__ import annotations

import json

import pytest

from nemo_gym_env.errors import DatasetError
from nemo_gym_env.protocol.dataset import check_row, input_items, iter_rows, load_rows


def test_dataset_rows_checked_with_line_numbers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join([
        json.dumps({"responses_create_params": {"input": "ok"}}),
        "{not json",
        json.dumps({"prompt": "no params"}),
        "",
        json.dumps({"responses_create_params": {"input": "x", "temperature": "hot"}}),
        json.dumps([1, 2]),
        json.dumps({"responses_create_params": {"input": "y", "bogus": 1}}),  # an unknown key is kept, not refused
    ]))
    problems = {n: p for n, _, p in iter_rows(path) if p}
    assert sorted(problems) == [2, 3, 5, 6]
    assert "not JSON" in problems[2] and "responses_create_params" in problems[3] and "temperature" in problems[5]
    with pytest.raises(DatasetError, match="line 2"):
        load_rows(path)
    assert len(load_rows(path, strict=False)) == 2
    assert check_row({"responses_create_params": {"input": "hi"}}) is None
    assert input_items({"responses_create_params": {"input": "hi"}}) == [{"role": "user", "content": "hi", "type": "message"}]
