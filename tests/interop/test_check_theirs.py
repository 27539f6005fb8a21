"""``nemo-gym-env check`` against NeMo Gym's own servers (0.4.0 under ``ng_run``, 0.7.0 run alone).

It must finish, never crash, and report every check with evidence; what it finds in theirs is
documented in docs/bring_your_env.md ("What check finds in NeMo Gym's servers"). The facts asserted
here are the ones that page states.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym_env.checker.suite import CHECKS, CheckSettings, check_server
from nemo_gym_env.client.loop import background_loop

from .conftest import their_rows_path
from .ng07 import ng07_python, their_rows, their_server

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(1800)]

SETTINGS = CheckSettings(timeout_s=30.0, time_limit_s=300.0, concurrency=8)


def check(url: str, rows: list[dict]) -> dict[str, tuple[str, str]]:
    report = background_loop().run(check_server(url, rows, SETTINGS), timeout=400)
    found = {c.name: (c.status, c.evidence) for c in report.checks}
    assert list(found) == list(CHECKS) and all(evidence for _, evidence in found.values())
    print(report.table())  # what the docs summarise; shown with -s
    return found


def _rows(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:8]


@pytest.mark.parametrize("server", ["example_single_tool_call", "example_session_state_mgmt", "mcqa"])
def test_check_reports_on_nemo_gym_04_servers(ng_stack, server):
    found = check(ng_stack.their_urls[server], _rows(their_rows_path(ng_stack.site_packages, server)))
    status = {name: s for name, (s, _) in found.items()}
    for name in ("protocol", "session_cookie", "end_empty", "end_wrong", "malformed_body"):
        assert status[name] == "pass", (name, found[name])
    assert status["session_contract"] == "skip", found["session_contract"]  # 0.4 predates the typed seed
    assert status["unknown_session"] == "warn", found["unknown_session"]  # a forged cookie is a new session


@pytest.fixture(scope="module")
def ng07(tmp_path_factory):
    return ng07_python(), tmp_path_factory.mktemp("check07")


_ALL_PASS = dict.fromkeys(CHECKS, "pass")
FOUND_07 = {
    # mcqa keeps no session state: it echoes the typed seed's id but never refuses a conflicting or late seed;
    # a 40 MiB body is read and taken; a forged cookie is a new session
    "mcqa": {**_ALL_PASS, "oversized_body": "warn", "unknown_session": "warn", "session_contract": "warn"},
    # example_single_tool_call tracks typed ids, but a conflicting seed raises: 500 instead of 409
    "example_single_tool_call": {**_ALL_PASS, "oversized_body": "warn", "unknown_session": "warn",
                                 "session_contract": "fail"},
    # blackjack deals from an unseeded random (the same row is another hand), and steps a session it never
    # reset: a forged cookie plays a hand nobody dealt
    "blackjack": {**_ALL_PASS, "isolation": "warn", "tools": "skip", "unknown_session": "warn",
                  "session_contract": "skip"},
}


@pytest.mark.parametrize(("server", "domain"), [("mcqa", "knowledge"), ("example_single_tool_call", "agent"),
                                                ("blackjack", "games")])
def test_check_reports_on_nemo_gym_07_servers(ng07, server, domain):
    python, workdir = ng07
    with their_server(python, server, workdir, domain=domain) as url:
        found = check(url, their_rows(python, server)[:8])
    statuses = {name: status for name, (status, _) in found.items()}
    if server == "blackjack" and statuses["isolation"] == "pass":  # two unseeded deals can still match
        statuses["isolation"] = "warn"
    assert statuses == FOUND_07[server], found
    if server == "example_single_tool_call":
        assert "conflicting seed -> 409: POST /seed_session -> 500" in found["session_contract"][1]
