"""Queries over the indexed files: filters, orders, pages, search, groups, and the summary's numbers."""

from __future__ import annotations

import json
import math

import pytest

from nemo_gym_env.rollouts.report import metrics_table, summarize
from nemo_gym_env.viewer.index import JsonlIndex
from nemo_gym_env.viewer.library import Query, RolloutLibrary
from nemo_gym_env.viewer.summary import file_summary, histogram
from tests.viewer.rollout_data import built_row, jsonl


@pytest.fixture
def played(played_file):
    """The session's played rollouts file: real server processes made it, so its tests are marked slow."""
    return played_file


def _library(*paths) -> RolloutLibrary:
    library = RolloutLibrary(paths)
    library.refresh()
    return library


def _rows(library, query):
    return [library.list_row(ref) for ref in library.page(query, 0, 10_000)[1]]


@pytest.mark.slow
def test_filters_by_server_reward_outcome_and_file(played):
    path, rows = played
    library = _library(path)
    assert [f.kind for f in library.files] == ["rollouts", "failures"]
    everything = _rows(library, Query())
    assert len(everything) == len(rows) + 3
    single = _rows(library, Query(server="example_single_tool_call"))
    assert len(single) == 4 and {r["server"] for r in single} == {"example_single_tool_call"}
    passed = _rows(library, Query(outcome="passed"))
    assert passed and all(r["reward"] > 0 and r["kind"] == "rollouts" for r in passed)
    failed = _rows(library, Query(outcome="failed"))
    assert len(passed) + len(failed) == len(everything)
    assert sum(r["kind"] == "failures" for r in failed) == 3  # failed rollouts have no reward: they failed
    assert all(r["reward"] == 1.0 for r in _rows(library, Query(min_reward=0.5)))
    assert all(r["reward"] == 0.0 for r in _rows(library, Query(max_reward=0.5)))
    assert len(_rows(library, Query(file=1))) == 3


@pytest.mark.slow
def test_orders_put_blanks_last_both_ways(played):
    library = _library(played[0])
    for descending in (False, True):
        rewards = [r["reward"] for r in _rows(library, Query(sort="reward", descending=descending))]
        present = [r for r in rewards if r is not None]
        assert present == sorted(present, reverse=descending) and rewards[-3:] == [None] * 3
    tasks = [r["task"] for r in _rows(library, Query(sort="task", descending=True))]
    assert tasks == sorted(tasks, reverse=True)
    lines = [(r["file"], r["line"]) for r in _rows(library, Query(sort="line", descending=True))]
    assert lines == sorted(lines, reverse=True)
    with pytest.raises(ValueError):
        library.query(Query(sort="nope"))


@pytest.mark.slow
def test_pages_cover_the_order_exactly_once(played):
    library = _library(played[0])
    query = Query(sort="reward", descending=True)
    matched, _ = library.page(query, 0, 1)
    seen = []
    for offset in range(0, matched, 3):
        seen += library.page(query, offset, 3)[1]
    assert len(seen) == matched == len(set(seen))
    assert library.page(query, matched + 5, 3) == (matched, [])


def test_text_search_matches_what_a_person_reads(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(jsonl([built_row(0, 0, 1.0, answer='She said "café"\nthen left'),
                            built_row(0, 1, 0.0, answer="nothing"),
                            built_row(1, 0, 0.0, answer="CAFÉ in capitals")]))
    library = _library(path)
    hits = lambda text: [(r["task"], r["rollout"]) for r in _rows(library, Query(text=text))]  # noqa: E731
    assert hits("café") == [(0, 0), (1, 0)]
    assert hits('said "café"') == [(0, 0)]
    assert hits('café"\nthen') == [(0, 0)]
    assert hits("no such text") == []
    with open(path, "ab") as handle:  # appended rows are searched too
        handle.write(jsonl([built_row(2, 0, 1.0, answer="another café")]))
    library.refresh()
    assert hits("café") == [(0, 0), (1, 0), (2, 0)]


@pytest.mark.slow
def test_group_is_one_tasks_rollouts_of_one_server_failures_last(played):
    library = _library(played[0])
    refs = library.group(0, "example_multi_step", 1)
    group = [library.list_row(ref) for ref in refs]
    assert [r["rollout"] for r in group] == [0, 1, 2, 3]
    assert {r["reward"] for r in group} == {0.0, 1.0}
    with_failure = [library.list_row(ref) for ref in library.group(0, "example_multi_step", 20)]
    assert [r["kind"] for r in with_failure] == ["failures"]
    assert library.group(0, "example_single_tool_call", 1) == []


@pytest.mark.slow
def test_summary_has_the_numbers_rollouts_prints(played):
    path, _ = played
    index, sidecar = JsonlIndex(path), JsonlIndex(path.with_name("rollouts_failures.jsonl"))
    index.refresh()
    sidecar.refresh()
    ours = file_summary(index, sidecar)
    theirs = summarize(path)
    assert ours["table"] == metrics_table(theirs)
    assert ours["metrics"]["num_failed"] == theirs["num_failed"] == 2  # the third failure has an output row
    for name, entry in theirs["per_server"].items():
        mine = next(s for s in ours["servers"] if s["name"] == name)
        assert mine["mean_reward"] == entry["agent_metrics"]["mean/reward"]
        assert mine["num_rollouts"] == entry["num_rollouts"] and mine["num_failed"] == entry["num_failed"]
        for k in mine["pass_at"]:
            assert math.isclose(k["percent"], entry["agent_metrics"][f"pass@{k['k']}/reward"])
        assert sum(b["count"] for b in mine["histogram"]) == entry["num_rollouts"]
    reasons = ours["failures_by_reason"]
    assert len(reasons) == 1 and reasons[0]["count"] == 2 and reasons[0]["source"] == "failed rollout"
    assert "no answer within N s" in reasons[0]["reason"]
    json.dumps(ours, allow_nan=False)


def test_histogram_bins():
    # Few distinct rewards: a bin per value, labelled by the value (a 1.0 reads 1.0, not "0.9").
    assert [(b["label"], b["count"]) for b in histogram([0.0, 1.0, 1.0, 0.55])] == [("0.0", 1), ("0.55", 1), ("1.0", 2)]
    assert [(b["label"], b["count"]) for b in histogram([0.0] * 44 + [-0.12, 1.0, 0.84])] == [
        ("-0.12", 1), ("0.0", 44), ("0.84", 1), ("1.0", 1)]
    assert histogram([]) == []
    assert histogram([3.0, 3.0]) == [{"low": 3.0, "high": 3.0, "count": 2, "label": "3.0"}]
    # Many: equal bins labelled by their range, the last one closed.
    spread = histogram([0.0, 1.0] + [0.05 + 0.1 * i for i in range(10)])
    assert [b["count"] for b in spread] == [2] + [1] * 8 + [2]
    assert spread[0]["label"] == "[0.0, 0.1)" and spread[-1]["label"] == "[0.9, 1.0]"
    wide = histogram([-2.0 + i * 0.25 for i in range(17)], bins=4)
    assert [b["count"] for b in wide] == [4, 4, 4, 5] and wide[0]["low"] == -2.0 and wide[-1]["high"] == 2.0
