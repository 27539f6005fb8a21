"""The byte-offset index of a rollouts file: rows, columns, growth, rewrites, damaged and hostile lines."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_env.rollouts.output import RolloutWriter
from nemo_gym_env.viewer.index import JsonlIndex
from nemo_gym_env.viewer.rows import row_stats
from tests.viewer.rollout_data import built_row, failure_row, jsonl


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_rows_columns_and_offsets_match_the_file(tmp_path):
    rows = [built_row(t, r, float(r % 2), server=f"s{t % 2}") for t in range(3) for r in range(4)]
    rows.append(failure_row(9, 0, "s0", "policy 'x': timed out"))
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"\n" + jsonl(rows[:5]) + b"   \n" + jsonl(rows[5:]))  # blank lines are not rows

    index = JsonlIndex(path)
    assert index.refresh() is True
    assert len(index) == len(rows) and not index.errors and index.complete
    for number, row in enumerate(rows):
        assert index.stats(number) == row_stats(row)
        assert index.row(number) == row
    assert [index.lines[n] for n in (0, 4, 5)] == [2, 6, 8]
    assert index.stats(12).failure == "policy_timeout: policy 'x': timed out"
    assert index.stats(0).tokens == 97 and index.stats(0).turns == 2 and index.stats(0).tool_calls == 1
    assert index.refresh() is False  # nothing new: nothing read


def test_appended_rows_are_read_alone(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(jsonl([built_row(0, r, 1.0) for r in range(3)]))
    index = JsonlIndex(path)
    index.refresh()
    before = index.indexed_bytes
    _append(path, jsonl([built_row(1, 0, 0.0)]))
    assert index.refresh() is True
    assert len(index) == 4 and index.offsets[3] == before
    assert index.stats(3).task == 1 and index.stats(3).reward == 0.0


def test_torn_last_line_waits_for_its_end(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    whole = json.dumps(built_row(0, 1, 1.0)).encode()
    path.write_bytes(jsonl([built_row(0, 0, 0.0)]) + whole[:100])  # a write cut short
    index = JsonlIndex(path)
    index.refresh()
    assert len(index) == 1 and index.pending_bytes == 100 and not index.errors
    _append(path, whole[100:] + b"\n")
    index.refresh()
    assert len(index) == 2 and index.pending_bytes == 0 and not index.errors
    assert index.stats(1).rollout == 1


def test_last_line_without_newline_is_shown_and_not_doubled(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(jsonl([built_row(0, 0, 0.0)]) + json.dumps(built_row(0, 1, 1.0)).encode())
    index = JsonlIndex(path)
    index.refresh()
    assert [index.stats(n).rollout for n in range(len(index))] == [0, 1]
    _append(path, b"\n" + jsonl([built_row(0, 2, 1.0)]))
    index.refresh()
    assert [index.stats(n).rollout for n in range(len(index))] == [0, 1, 2]


def test_a_rewritten_or_replaced_file_is_indexed_anew(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    with RolloutWriter(path) as writer:
        for r in range(5):
            writer.write(built_row(0, r, 1.0))
    index = JsonlIndex(path)
    index.refresh()
    epoch = index.epoch
    with RolloutWriter(path) as writer:  # a new run over the same file: truncated, then written again
        for r in range(7):
            writer.write(built_row(3, r, 0.0, answer="x" * 40))
    index.refresh()
    assert len(index) == 7 and {index.stats(n).task for n in range(7)} == {3} and index.epoch > epoch

    other = tmp_path / "other.jsonl"
    other.write_bytes(jsonl([built_row(8, 0, 1.0)]))
    os.replace(other, path)
    index.refresh()
    assert len(index) == 1 and index.stats(0).task == 8
    path.unlink()
    index.refresh()
    assert len(index) == 0


def test_lines_that_are_not_rows_are_recorded_by_line_number(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    good = json.dumps(built_row(0, 0, 1.0)).encode()
    bad_utf8 = json.dumps(built_row(0, 1, 0.0, answer="caf\u00e9")).encode().replace(b"caf\\u00e9", b"caf\xe9")
    lines = [
        good,                                          # 1
        b"{not json",                                  # 2
        b"[1, 2, 3]",                                  # 3
        b"null",                                       # 4
        bad_utf8,                                      # 5: a row, with a warning
        b"[" * 100_000 + b"]" * 100_000,               # 6: nested beyond any parser's stack
        b'{"reward": ' + b"9" * 5000 + b"}",           # 7: an integer longer than Python converts
        b'{"reward": 1e400, "_ng_task_index": 10000000000000000000000000000}',  # 8: a row, blank columns
        good,                                          # 9
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    index = JsonlIndex(path)
    index.refresh()
    errors = {e.line: e for e in index.errors}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7]
    assert errors[2].message.startswith("not JSON") and errors[2].level == "error"
    assert "not a rollout row" in errors[3].message and "not a rollout row" in errors[4].message
    assert errors[5].level == "warning" and "UTF-8" in errors[5].message
    assert "nested too deeply" in errors[6].message
    assert errors[7].level == "error"
    assert [index.lines[n] for n in range(len(index))] == [1, 5, 8, 9]
    assert index.row(1)["extracted_answer"] == "caf\ufffd"
    assert index.stats(2).reward is None and index.stats(2).task is None  # inf and a 94-bit integer: blank


def test_an_oversized_line_is_skipped_without_being_held(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    limit = 1024 * 1024
    huge = json.dumps(built_row(0, 1, 1.0, answer="y" * (20 * limit))).encode()
    path.write_bytes(jsonl([built_row(0, 0, 0.0)]) + huge + b"\n" + jsonl([built_row(0, 2, 1.0)]))
    index = JsonlIndex(path, max_row_bytes=limit)
    tracemalloc.start()
    try:
        index.refresh()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [index.stats(n).rollout for n in range(len(index))] == [0, 2]
    assert index.errors[0].line == 2 and "over the viewer's limit" in index.errors[0].message
    # Reading in blocks costs a few times the limit, whatever the line: never the line itself.
    assert peak < 8 * limit < len(huge) / 5, f"peak {peak} bytes for a {len(huge)}-byte line"


def test_refresh_in_slices_reads_a_bounded_amount_each_time(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(jsonl([built_row(t, 0, 1.0) for t in range(500)]))
    size = path.stat().st_size
    index = JsonlIndex(path)
    index.refresh(max_bytes=size // 10)
    assert 0 < len(index) < 500 and not index.complete
    assert index.indexed_bytes < size // 10 + 2 * (size // 500)
    calls = 1
    while not index.complete:
        index.refresh(max_bytes=size // 10)
        calls += 1
    assert len(index) == 500 and calls <= 12


_LINES = st.one_of(
    st.builds(lambda t, r, w: json.dumps(built_row(t, r, w)).encode(), st.integers(0, 5), st.integers(0, 3),
              st.sampled_from([0.0, 0.5, 1.0])),
    st.sampled_from([b"", b"  ", b"{oops", b"[]", b"42", b'"text"', b"\xff\xfe", b'{"a": "\xff"}']),
)


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(_LINES, max_size=12), cuts=st.lists(st.integers(0, 10**6), max_size=6))
def test_growing_in_any_pieces_gives_the_index_of_the_whole_file(tmp_path_factory, lines, cuts):
    """However the writes fall (torn lines included), the index ends as if the file were read at once."""
    data = b"".join(line + b"\n" for line in lines)
    folder = tmp_path_factory.mktemp("grow")
    path, whole = folder / "grow.jsonl", folder / "whole.jsonl"
    whole.write_bytes(data)
    reference = JsonlIndex(whole)
    reference.refresh()

    path.write_bytes(b"")
    index = JsonlIndex(path)
    written = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}) + [len(data)]:
        _append(path, data[written:cut])
        written = max(written, cut)
        index.refresh()
        assert not [e for e in index.errors if e.offset + 1 > written]  # nothing unfinished is an error
    assert list(index.offsets) == list(reference.offsets)
    assert [index.stats(n) for n in range(len(index))] == [reference.stats(n) for n in range(len(reference))]
    assert [(e.line, e.level) for e in index.errors] == [(e.line, e.level) for e in reference.errors]
    assert index.complete and index.pending_bytes == 0
