"""``nemo-gym-env view`` as a real process on loopback: its JSON API, its static files, and hostile input."""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from nemo_gym_env.rollouts.output import failures_path
from nemo_gym_env.rollouts.report import metrics_table, summarize
from nemo_gym_env.system.redaction import REDACTED
from tests.cli.conftest import assert_one_line_error, run_cli
from tests.viewer.conftest import running_cli, wait_until
from tests.viewer.rollout_data import HOSTILE, built_row, jsonl

SECRET = "sk-viewertest-0123456789abcdefghij"

pytestmark = pytest.mark.slow  # real processes on loopback


def messy_file(path):
    """Rows a person should see whatever they hold, between lines that are not rows."""
    deep: dict = {}
    node = deep
    for _ in range(200):
        node["d"] = {}
        node = node["d"]
    rows = [
        built_row(0, 0, 0.0, server=HOSTILE[0], text=HOSTILE[1], tool_output=HOSTILE[2], answer=HOSTILE[3]),   # line 1
        built_row(0, 1, 1.0, tool_output=f'{{"echo": "the key is {SECRET}"}}', failure_reason=HOSTILE[1]),      # line 2
    ]
    huge = json.dumps(built_row(1, 0, 0.0, big=10**30)).replace('"reward": 0.0', '"reward": 1e400')             # line 5
    broken = json.dumps(built_row(2, 0, 0.0, answer="caf\u00e9")).encode().replace(b"caf\\u00e9", b"caf\xe9")  # line 6
    path.write_bytes(jsonl(rows) + b"{this is not json\n" + b"[1, 2]\n" + huge.encode() + b"\n" + broken + b"\n"
                     + jsonl([built_row(3, 0, 1.0, nested=deep)]))                                               # line 7
    return path


@pytest.fixture(scope="module")
def viewer(tmp_path_factory, played_file):
    folder = tmp_path_factory.mktemp("view")
    (folder / "env.yaml").write_text(f"policy_base_url: http://127.0.0.1:9/v1\npolicy_api_key: {SECRET}\n"
                                     "policy_model_name: m\n")
    (folder / "clean").mkdir()
    clean = folder / "clean" / "rollouts.jsonl"
    shutil.copy(played_file[0], clean)
    shutil.copy(failures_path(played_file[0]), failures_path(clean))
    (folder / "messy").mkdir()
    messy_file(folder / "messy" / "rollouts.jsonl")
    with running_cli("view", "clean/rollouts.jsonl", "messy/rollouts.jsonl", cwd=folder) as running:
        running.folder = folder
        running.wait_complete = lambda: _wait_complete(running)
        running.wait_complete()
        yield running


def _wait_complete(running):
    return wait_until(lambda: running.get("/api/status").json()["complete"], what="the files to be indexed")


def test_prints_its_loopback_url_and_the_files(viewer):
    assert viewer.url.startswith("http://127.0.0.1:")
    wait_until(lambda: any("Ctrl-C" in line for line in viewer.stdout), what="the banner")
    out = "".join(viewer.stdout)
    assert "clean/rollouts.jsonl" in out and "clean/rollouts_failures.jsonl" in out
    assert "messy/rollouts_failures.jsonl  (not there yet" in out
    files = viewer.get("/api/status").json()["files"]
    assert [(f["kind"], f["partner"], f["rows"]) for f in files] == [
        ("rollouts", 1, 12), ("failures", 0, 3), ("rollouts", 3, 5), ("failures", 2, 0)]


def test_list_filters_sorts_and_pages(viewer):
    data = viewer.get("/api/rollouts", params={"file": 0, "server": "example_multi_step", "outcome": "failed"}).json()
    assert data["matched"] == 4 and {r["reward"] for r in data["rows"]} == {0.0}
    assert data["total"] == 12 + 3 + 5
    assert set(data["servers"]) >= {"example_multi_step", "example_single_tool_call", HOSTILE[0]}
    ranked = viewer.get("/api/rollouts", params={"file": 0, "sort": "reward", "order": "desc"}).json()["rows"]
    assert [r["reward"] for r in ranked] == sorted((r["reward"] for r in ranked), reverse=True)
    pages = [viewer.get("/api/rollouts", params={"offset": o, "limit": 7}).json()["rows"] for o in (0, 7, 14)]
    keys = [(r["file"], r["number"]) for page in pages for r in page]
    assert len(keys) == len(set(keys)) == 20
    narrow = viewer.get("/api/rollouts", params={"min_reward": 0.5, "max_reward": 1, "q": "famished"}).json()
    assert narrow["matched"] == 4 and {r["server"] for r in narrow["rows"]} == {"example_multi_step"}


@pytest.mark.parametrize(("params", "message"), [
    ({"sort": "nope"}, "sort: one of"),
    ({"outcome": "maybe"}, "outcome: one of"),
    ({"limit": 10_000}, "limit"),
    ({"offset": -1}, "offset"),
    ({"order": "sideways"}, "order"),
    ({"min_reward": "lots"}, "min_reward"),
    ({"q": "x" * 501}, "q"),
    ({"file": 99}, "no file 99"),
])
def test_bad_list_parameters_get_a_clear_422_or_404(viewer, params, message):
    reply = viewer.get("/api/rollouts", params=params)
    assert reply.status_code in (404, 422) and message in reply.json()["error"]


def test_a_rollout_is_its_whole_row_with_its_place_and_group(viewer, played_file):
    first = json.loads(played_file[0].read_text().splitlines()[0])
    data = viewer.get("/api/rollouts/0/0").json()
    assert data["row"] == first
    assert (data["line"], data["path"], data["task"], data["rollout"]) == (1, "clean/rollouts.jsonl", 0, 0)
    assert data["group"] == {"file": 0, "task": 0, "server": "example_multi_step"}
    assert data["turns"] == 3 and data["tool_calls"] == 4
    failed = viewer.get("/api/rollouts/1/0").json()
    assert failed["kind"] == "failures" and "no answer within 60 s" in failed["failure"]


@pytest.mark.parametrize("path", ["/api/rollouts/0/999", "/api/rollouts/0/-1", "/api/rollouts/9/0",
                                  "/api/group/0/77?server=example_multi_step", "/api/nothing"])
def test_unknown_rows_files_and_routes_are_404(viewer, path):
    reply = viewer.get(path)
    assert reply.status_code == 404 and reply.json()["error"]


def test_a_group_is_every_rollout_of_one_task(viewer):
    data = viewer.get("/api/group/0/1", params={"server": "example_multi_step"}).json()
    assert data["count"] == 4 and [r["rollout"] for r in data["rows"]] == [0, 1, 2, 3]
    assert {r["reward"] for r in data["rows"]} == {0.0, 1.0}
    assert all(r["row"]["_ng_task_index"] == 1 for r in data["rows"])
    assert [r["kind"] for r in viewer.get("/api/group/0/20", params={"server": "example_multi_step"}).json()["rows"]] == [
        "failures"]


def test_the_summary_is_what_rollouts_prints(viewer):
    data = viewer.get("/api/summary").json()
    clean = data["files"][0]
    theirs = summarize(viewer.folder / "clean" / "rollouts.jsonl")
    assert clean["table"] == metrics_table(theirs)
    assert clean["metrics"]["num_failed"] == 2 and clean["metrics"]["num_rollouts"] == 12
    assert clean["failures_by_reason"][0]["count"] == 2
    assert [s["name"] for s in clean["servers"]] == ["example_multi_step", "example_single_tool_call"]
    assert data["files"][1]["path"] == "messy/rollouts.jsonl"


def test_lines_that_are_not_rows_are_listed_by_line_and_the_rest_is_served(viewer):
    errors = viewer.get("/api/errors").json()["errors"]
    assert [(e["path"], e["line"], e["level"]) for e in errors] == [
        ("messy/rollouts.jsonl", 3, "error"), ("messy/rollouts.jsonl", 4, "error"),
        ("messy/rollouts.jsonl", 6, "warning")]
    assert errors[0]["message"].startswith("not JSON")
    lines = [r["line"] for r in viewer.get("/api/rollouts", params={"file": 2}).json()["rows"]]
    assert lines == [1, 2, 5, 6, 7]


def test_hostile_values_arrive_as_strict_json_text(viewer):
    rows = {r["line"]: r for r in viewer.get("/api/rollouts", params={"file": 2}).json()["rows"]}
    huge = viewer.get(f"/api/rollouts/2/{rows[5]['number']}")
    assert "Infinity" not in huge.text.replace('"Infinity"', "")  # never a bare Infinity a browser cannot parse
    assert huge.json()["row"]["reward"] == "Infinity" and huge.json()["row"]["big"] == str(10**30)
    assert rows[5]["reward"] is None
    broken = viewer.get(f"/api/rollouts/2/{rows[6]['number']}").json()
    assert broken["row"]["extracted_answer"] == "caf\ufffd"
    deep = viewer.get(f"/api/rollouts/2/{rows[7]['number']}").json()
    assert "nested deeper than" in json.dumps(deep)
    hostile = viewer.get(f"/api/rollouts/2/{rows[1]['number']}").json()
    assert hostile["server"] == HOSTILE[0] and hostile["row"]["response"]["output"][2]["output"] == HOSTILE[2]


def test_no_secret_of_env_yaml_is_in_any_reply(viewer):
    bodies = [viewer.get(path).text for path in (
        "/", "/static/view.js", "/api/status", "/api/summary", "/api/errors", "/api/rollouts?limit=500",
        f"/api/rollouts?q={SECRET[:12]}", "/api/group/2/0?server=built")]
    for entry in viewer.get("/api/rollouts", params={"limit": 500}).json()["rows"]:
        bodies.append(viewer.get(f"/api/rollouts/{entry['file']}/{entry['number']}").text)
    assert all(SECRET not in body for body in bodies)
    row = viewer.get("/api/rollouts/2/1").json()["row"]
    assert row["response"]["output"][2]["output"] == f'{{"echo": "the key is {REDACTED}"}}'


@pytest.mark.parametrize("target", [
    b"/static/../cli.py", b"/static/%2e%2e/cli.py", b"/static/..%2fcli.py", b"/static/..%2F..%2Fconfig.py",
    b"/static/%2e%2e%2f%2e%2e%2fetc%2fpasswd", b"/static/../../../../etc/passwd", b"/static/", b"/static/STYLE.CSS",
    b"/static/style.css%00.py", b"/static/./view.js/..", b"/../nemo_gym_env/cli.py", b"//etc/passwd",
])
def test_static_routes_serve_only_the_page_files(viewer, target):
    reply = viewer.raw(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    status = int(reply.split(b" ", 2)[1])
    assert status in (400, 404, 405), reply[:200]
    assert b"import " not in reply and b"root:" not in reply


def test_the_page_and_its_files_carry_a_strict_content_security_policy(viewer):
    for path, kind in (("/", "text/html"), ("/static/view.js", "text/javascript"), ("/static/common.js", "text/javascript"),
                       ("/static/style.css", "text/css"), ("/api/status", "application/json")):
        reply = viewer.get(path)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(kind)
        assert "script-src 'self'" in reply.headers["content-security-policy"]
        assert reply.headers["x-content-type-options"] == "nosniff"
    assert "<script type=\"module\" src=\"/static/view.js\">" in viewer.get("/").text


def test_a_request_for_another_host_name_is_refused(viewer):
    reply = viewer.raw(b"GET /api/status HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 421")
    assert viewer.get("/api/status", headers={"Host": "localhost"}).status_code == 200


def test_an_oversized_request_is_refused_and_the_viewer_goes_on(viewer):
    reply = viewer.raw(b"GET /api/rollouts?q=" + b"x" * 200_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Connection: close\r\n\r\n")
    assert reply == b"" or int(reply.split(b" ", 2)[1]) >= 400
    assert viewer.get("/api/status").status_code == 200


def test_sigterm_and_ctrl_c_stop_it_cleanly(tmp_path):
    for sig in (signal.SIGTERM, signal.SIGINT):
        with running_cli("view", "none.jsonl", cwd=tmp_path) as running:
            assert running.get("/api/status").status_code == 200
            assert running.stop(sig) == 0


@pytest.mark.parametrize(("args", "says"), [
    (("--max-row-mb", "0"), "--max-row-mb must be > 0"),
    (("--env-yaml", "missing.yaml"), "env file 'missing.yaml' not found"),
    (("--host", "256.1.1.1"), "cannot resolve host '256.1.1.1'"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, args, says):
    result = run_cli("view", *args, cwd=tmp_path)
    assert_one_line_error(result)
    assert says in result.stderr
