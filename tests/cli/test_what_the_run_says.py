"""What ``nemo-gym-env rollouts`` tells a person, and the next commands on its output, as real processes.

One run (:func:`tests.cli.conftest.run_mixed`) on three servers with a test model whose rollouts end
every way a row can: the table counts what the model did per server (right, no tool call, a bad
tool call, the server's own ``failure_kind``), pass rates stay rates for a game's negative
returns, the metrics file holds the same counts, the run ends with the command that opens the
viewer on its output, and ``reverify`` on that very file skips the game's rows saying why and
exits 0.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex

import pytest

from nemo_gym_env.rollouts.output import metrics_path
from tests.cli.conftest import REWARDS_CONFIG, mixed_run, read_jsonl, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixed")
    return folder, mixed_run(folder)


def _table_line(stdout: str, server: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith(server + " "))
    return re.split(r"\s{2,}", line.strip())


def test_the_table_says_what_the_model_did_per_server(mixed):
    _, result = mixed
    weather = _table_line(result.stdout, "example_single_tool_call")
    assert weather[1:5] == ["4", "8", "0", "0.250"]
    assert weather[-1] == "bad tool call 4, no tool call 2, right 2"
    scored = _table_line(result.stdout, "rewards")
    assert scored[4] == "0.333" and scored[-2] == "0"
    assert scored[-1] == "wrong_answer 4, right 2"
    game = _table_line(result.stdout, "guess_number")
    assert float(game[4]) < 0  # the game's return: every turn without a guess costs 0.1
    assert game[5:7] == ["0.0", "0.0 (k=2)"] and game[-1] == "wrong 4"  # a pass rate, never "-64.0 %"
    for meaning in ("no tool call: the task offers tools and the model called none: it answered in prose",
                    "bad tool call: a tool call the environment could not run"):
        assert meaning in result.stdout


def test_the_metrics_file_holds_the_same_counts_and_rows_say_why(mixed):
    folder, _ = mixed
    summary = json.loads(metrics_path(folder / "results" / "rollouts.jsonl").read_text())
    per = summary["per_server"]
    assert per["example_single_tool_call"]["outcomes"] == {"bad_tool_call": 4, "no_tool_call": 2, "right": 2}
    assert per["rewards"]["outcomes"] == {"wrong_answer": 4, "right": 2}
    assert per["rewards"]["num_masked"] == 0 and per["rewards"]["failure_kinds"] == {"wrong_answer": 4}
    assert per["guess_number"]["outcomes"] == {"wrong": 4}
    assert per["guess_number"]["agent_metrics"]["pass@1/reward"] == 0.0
    assert summary["outcomes"] == {"wrong": 4, "bad_tool_call": 4, "wrong_answer": 4, "no_tool_call": 2, "right": 4}
    rows = read_jsonl(folder / "results" / "rollouts.jsonl")
    errors = sorted(e for row in rows for e in row.get("tool_call_errors", []))
    assert len(errors) == 4
    assert errors[0].startswith("Malformed tool call, taken as the final answer: the <tool_call> body is not JSON")
    assert errors[-1] == ("Unknown tool 'nosuch': not a tool of this environment; its tools are: get_weather")


def test_the_run_ends_with_the_command_that_opens_the_viewer(mixed):
    _, result = mixed
    last = result.stdout.strip().splitlines()[-1]
    assert last == "view:     nemo-gym-env view results/rollouts.jsonl"
    assert shlex.split(last.split(":", 1)[1])[1:] == ["view", "results/rollouts.jsonl"]


def test_reverify_on_the_runs_own_file_skips_game_rows_saying_which_and_why(mixed):
    folder, _ = mixed
    result = run_cli("reverify", "results/rollouts.jsonl", "example_single_tool_call", "guess_number",
                     f"+config_paths=[{REWARDS_CONFIG}]", "--no-env-yaml", cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(folder / "results" / "rollouts.jsonl")
    games = [n for n, row in enumerate(rows, 1) if row["agent_ref"]["name"] == "guess_number"]
    skipped = [line for line in result.stderr.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and "skipping 4 row(s) of guess_number" in skipped[0]
    assert "Gymnasium-protocol server (/reset + /step) has no /verify" in skipped[0]
    assert all(str(n) in skipped[0] for n in (games[0], games[-1]))
    started = [line for line in result.stderr.splitlines() if "started" in line]
    assert len(started) == 1 and "guess_number" not in started[0], started  # its rows are skipped: never started
    again = read_jsonl(folder / "results" / "rollouts_reverified.jsonl")
    assert len(again) == len(rows) - 4 and {r["agent_ref"]["name"] for r in again} == {"example_single_tool_call", "rewards"}
    assert "guess_number" not in result.stdout and "example_single_tool_call" in result.stdout


def test_an_episode_that_spends_its_tokens_is_scored_as_it_stands(tmp_path):
    """``--max-episode-tokens`` bounds what one episode may cost: each turn may use what is left, then it is verified."""
    import httpx

    from tests.fixtures.openai_server import running_server

    with running_server() as base_url:
        result = run_cli("rollouts", "guess_number", "--policy", "openai", "--base-url", base_url, "--model",
                         "acts-budget", "--limit", "2", "--max-episode-tokens", "2", "--no-env-yaml", cwd=tmp_path,
                         timeout=300)
        last = httpx.get(f"{base_url}/_last/acts-budget", trust_env=False).json()
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(tmp_path / "results" / "rollouts.jsonl")
    for row in rows:  # the test model's Responses replies count one output token per item: two turns, then done
        said = [i for i in row["response"]["output"] if i.get("role") == "assistant"]
        assert len(said) == 2 and row["truncated"] is True and row["response"]["usage"]["output_tokens"] == 2
    assert last["max_output_tokens"] == 1  # the second turn was offered only the token left
    assert _table_line(result.stdout, "guess_number")[-1] == "cut off 2"


def test_long_episodes_start_first(tmp_path):
    """Games first, then tasks that offer tools, then the rest, whatever order the servers are named in:
    the many-turn episodes are under way while one-turn ones fill the batch (one at a time here, so
    the rows land in the order the rollouts started)."""
    result = run_cli("rollouts", "math", "example_single_tool_call", "guess_number", "--policy", "scripted",
                     "--concurrency", "1", "--limit", "2", "--no-env-yaml", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    order = [row["agent_ref"]["name"] for row in read_jsonl(tmp_path / "results" / "rollouts.jsonl")]
    assert order == ["guess_number"] * 2 + ["example_single_tool_call"] * 2 + ["math"] * 2


@pytest.mark.skipif(not importlib.util.find_spec("torch"), reason="the local policy needs torch")
def test_a_model_that_cannot_load_while_the_servers_start_fails_the_run_in_one_line(tmp_path):
    result = run_cli("rollouts", "example_single_tool_call", "--policy", "local", "--model", str(tmp_path / "nothing"),
                     "--limit", "1", "--no-env-yaml", cwd=tmp_path, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "started 1 server(s)" in result.stderr  # the model loaded (and failed) while they started
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "nothing" in errors[0], result.stderr
    assert not (tmp_path / "results" / "rollouts.jsonl").exists() or not read_jsonl(tmp_path / "results" / "rollouts.jsonl")
