"""``nemo-gym-env view`` on files that change or are huge: following a run, a 50 MB line, 100,000 rows.

Memory and reading are measured from outside the process (``/proc/<pid>/status`` peak RSS,
``/proc/<pid>/io`` bytes read), never by wall-clock thresholds.
"""

from __future__ import annotations

import json
import os

import pytest

from nemo_gym_env.rollouts.output import RolloutWriter
from tests.viewer.conftest import proc_read_bytes, proc_status, running_cli, wait_until
from tests.viewer.rollout_data import built_row, failure_row

MB = 1024 * 1024

pytestmark = pytest.mark.slow  # real processes on loopback


def _matched(running, **params) -> int:
    return running.get("/api/rollouts", params=params).json()["matched"]


def test_follows_a_run_as_rollouts_writes_it(tmp_path):
    with running_cli("view", "results/rollouts.jsonl", cwd=tmp_path) as running:
        status = running.get("/api/status").json()
        assert [(f["exists"], f["rows"]) for f in status["files"]] == [(False, 0), (False, 0)]
        output = tmp_path / "results" / "rollouts.jsonl"
        with RolloutWriter(output) as writer:  # what `rollouts` writes with, row by row
            for rollout in range(3):
                writer.write(built_row(0, rollout, float(rollout % 2)))
                wait_until(lambda: _matched(running) == rollout + 1, what=f"row {rollout + 1} to appear")
            writer.write(failure_row(1, 0, "built", "server_error: 500"))
            wait_until(lambda: _matched(running, file=1) == 1, what="the failures sidecar to be followed")

        whole = (json.dumps(built_row(0, 3, 1.0)) + "\n").encode()
        with open(output, "ab") as handle:  # a row half written: not a row yet, not an error
            handle.write(whole[:200])
            handle.flush()
            wait_until(lambda: running.get("/api/status").json()["files"][0]["pending_bytes"] == 200,
                       what="the torn line to be seen")
            assert _matched(running, file=0) == 3 and running.get("/api/errors").json()["count"] == 0
            handle.write(whole[200:])
        wait_until(lambda: _matched(running, file=0) == 4, what="the finished row")

        with RolloutWriter(output) as writer:  # a new run over the same file starts it over
            writer.write(built_row(5, 0, 0.0))
        wait_until(lambda: _matched(running) == 1, what="the new run's rows alone")
        rows = running.get("/api/rollouts").json()["rows"]
        assert [(r["task"], r["rollout"]) for r in rows] == [(5, 0)]


def test_a_50_mb_line_is_an_error_and_is_never_held(tmp_path):
    with running_cli("view", "rollouts.jsonl", cwd=tmp_path) as running:
        wait_until(lambda: running.get("/api/status").json()["complete"], what="the empty start")
        baseline = proc_status(running.pid, "VmHWM")
        huge = json.dumps(built_row(0, 1, 1.0, answer="z" * (50 * MB))).encode()
        (tmp_path / "rollouts.jsonl").write_bytes(
            (json.dumps(built_row(0, 0, 0.0)) + "\n").encode() + huge + b"\n" + (json.dumps(built_row(0, 2, 1.0)) + "\n").encode())
        wait_until(lambda: _matched(running) == 2, what="the rows around the long line")
        errors = running.get("/api/errors").json()["errors"]
        assert [(e["line"], e["level"]) for e in errors] == [(2, "error")]
        assert "over the viewer's limit of 16 MiB" in errors[0]["message"]
        assert [r["line"] for r in running.get("/api/rollouts").json()["rows"]] == [1, 3]
        grown = proc_status(running.pid, "VmHWM") - baseline
        assert grown < 40 * MB < len(huge), f"peak RSS grew {grown / MB:.1f} MiB reading a {len(huge) / MB:.0f} MiB line"


def _write_many(path, count: int) -> int:
    """``count`` rollout rows of about a kilobyte, written fast (one template, formatted)."""
    template = json.dumps(built_row(0, 0, 0.0, server="SERVER", answer="ANSWER")).replace("%", "%%")
    template = (template.replace('"_ng_task_index": 0', '"_ng_task_index": %(task)d')
                .replace('"_ng_rollout_index": 0', '"_ng_rollout_index": %(rollout)d')
                .replace('"reward": 0.0', '"reward": %(reward)s')
                .replace('"SERVER"', '"server_%(server)d"').replace('"ANSWER"', '"answer %(n)d"'))
    with open(path, "w") as handle:
        for n in range(count):
            handle.write(template % {"task": n // 8, "rollout": n % 8, "reward": "1.0" if n % 3 == 0 else "0.0",
                                     "server": n % 4, "n": n} + "\n")
    return path.stat().st_size


def test_100000_rows_open_at_once_in_bounded_memory(tmp_path):
    rows = 100_000
    staged = tmp_path / "staged.jsonl"
    size = _write_many(staged, rows)
    with running_cli("view", "rollouts.jsonl", cwd=tmp_path) as running:
        wait_until(lambda: running.get("/api/status").json()["complete"], what="the empty start")
        baseline_rss = proc_status(running.pid, "VmRSS")
        read_before = proc_read_bytes(running.pid)
        os.replace(staged, tmp_path / "rollouts.jsonl")  # the whole file appears at once

        # The first page is answered from the rows indexed so far, long before the file is read.
        first = wait_until(lambda: running.get("/api/rollouts", params={"limit": 50}).json()["rows"],
                           interval=0.01, what="the first page")
        read_for_first_page = proc_read_bytes(running.pid) - read_before
        assert len(first) == 50 and [r["line"] for r in first] == list(range(1, 51))
        assert read_for_first_page < size / 2, f"{read_for_first_page / MB:.1f} MiB read of {size / MB:.1f} MiB"

        wait_until(lambda: running.get("/api/status").json()["complete"], timeout=300, what="the whole index")
        status = running.get("/api/status").json()["files"][0]
        assert status["rows"] == rows and status["indexed_bytes"] == size
        grown = proc_status(running.pid, "VmHWM") - baseline_rss

        # Pages, orders, filters and rows are read from the index and a row's own bytes, not the file.
        read_before = proc_read_bytes(running.pid)
        page = running.get("/api/rollouts", params={"offset": 70_000, "limit": 50, "sort": "reward",
                                                    "order": "desc", "server": "server_2"}).json()
        assert page["matched"] == rows // 4 and len(page["rows"]) == 0  # 25,000 match: offset past them
        page = running.get("/api/rollouts", params={"offset": 20_000, "limit": 50, "sort": "task"}).json()
        assert len(page["rows"]) == 50 and page["rows"][0]["task"] == 20_000 // 8
        detail = running.get(f"/api/rollouts/0/{page['rows'][0]['number']}").json()
        group = running.get(f"/api/group/0/{detail['task']}", params={"server": detail["server"]}).json()
        read_for_pages = proc_read_bytes(running.pid) - read_before
        assert detail["row"]["_ng_task_index"] == 20_000 // 8 and group["count"] == 2
        assert read_for_pages < 64 * 1024, f"{read_for_pages} bytes read for two pages, a row and a group"

        print(f"\n100,000 rows, {size / MB:.0f} MiB: peak RSS +{grown / MB:.1f} MiB; first page after "
              f"{read_for_first_page / MB:.1f} MiB read; pages, a row and a group read {read_for_pages} bytes")
        assert grown < 40 * MB < size, f"peak RSS grew {grown / MB:.1f} MiB for a {size / MB:.0f} MiB file"
