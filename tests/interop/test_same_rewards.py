"""Same data, same rewards: every server both projects ship, their rows and ours, the same moves
through NeMo Gym's server and ours, compared reward by reward, metric by metric, tool output by
tool output. Where ours differs on purpose, the difference is asserted, not skipped.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

import nemo_gym_env  # noqa: F401  (registers the ids)
from nemo_gym_env.launch.catalog import bundled_servers
from nemo_gym_env.protocol.metrics import numeric_fields

from .conftest import SHARED_SERVERS, THEIR_SERVERS, NgStack, our_player, our_rows, read_rows, their_rows_path
from .players import PLAYERS, play_episode

pytestmark = [pytest.mark.interop, pytest.mark.timeout(900)]  # the first test also starts ng_run

COMPARED = [s for s in THEIR_SERVERS if s in bundled_servers()]
"""Servers both projects ship (the three examples, and mcqa where this checkout bundles one)."""

OUR_EXTRA_METRICS = {
    "example_single_tool_call": {"num_tool_calls"},  # documented in its app.py and README
}
"""Verify-reply metrics only our server reports; every other numeric field must match exactly."""


def _reward_difference(server: str, correct: bool) -> tuple[float, float] | None:
    """(theirs, ours) where the rewards differ by design; None where they must be equal."""
    if server == "example_single_tool_call" and not correct:
        # Theirs rewards every episode 1.0; ours only one that called get_weather with a city.
        return (1.0, 0.0)
    return None


def _rejected_by_theirs(server: str, row: dict[str, Any]) -> bool:
    """Rows in a format only ours accepts (asserted as such, not skipped)."""
    return server == "mcqa" and isinstance(row.get("options"), dict)


def _metrics(verify: dict[str, Any], row: dict[str, Any]) -> dict[str, float]:
    """The verifier's own numeric metrics: the reply's numeric fields minus reward and echoed row fields."""
    return {k: v for k, v in numeric_fields(verify).items() if k != "reward" and k not in row}


def _player(server: str) -> Any:
    # Our bundled players read only row fields both projects' rows carry; mcqa's is in players.py.
    return our_player(server) if server in SHARED_SERVERS else PLAYERS[server]


@pytest.fixture(scope="module")
def our_urls(launched: dict[str, str]) -> dict[str, str | None]:
    return {s: launched.get(s) for s in COMPARED}


def _make(url: str | None, server: str, rows: list[dict]) -> gym.Env:
    if url is None:  # not launched by the session fixture: the env's embedded server
        return gym.make(f"NemoGym/{server}-v0", dataset=rows)
    return gym.make("NemoGym/Generic-v0", base_url=url, dataset=rows)


@pytest.mark.parametrize("correct", [True, False], ids=["correct", "wrong"])
@pytest.mark.parametrize("rows_of", ["their_rows", "our_rows"])
@pytest.mark.parametrize("server", COMPARED)
def test_same_moves_same_rewards(ng_stack: NgStack, our_urls: dict, server: str, rows_of: str,
                                 correct: bool) -> None:
    rows = (read_rows(their_rows_path(ng_stack.site_packages, server)) if rows_of == "their_rows"
            else our_rows(server))
    theirs_env = _make(ng_stack.their_urls[server], server, rows)
    ours_env = _make(our_urls[server], server, rows)
    player = _player(server)
    try:
        for task_index in range(len(rows)):
            theirs = play_episode(theirs_env, player, correct=correct, options={"task_index": task_index})
            ours = play_episode(ours_env, player, correct=correct, options={"task_index": task_index})
            where = (server, rows_of, task_index)
            if _rejected_by_theirs(server, rows[task_index]):
                # Our mcqa also takes options as one {letter: text} dict; NeMo Gym's request model
                # wants a list of one-key dicts and answers 422 (the episode ends with the error).
                assert theirs["truncated"] and "HTTP 422" in theirs["info"]["error"], where
                assert ours["terminated"] and ours["reward"] == (1.0 if correct else 0.0), where
                continue
            for result in (theirs, ours):
                assert result["terminated"] and not result["truncated"], (where, result["info"])
            # Every tool answered the same bytes: the model could not tell the servers apart.
            assert theirs["observations"] == ours["observations"], where
            difference = _reward_difference(server, correct)
            if difference is None:
                assert theirs["reward"] == ours["reward"] == (1.0 if correct else 0.0), where
            else:
                assert (theirs["reward"], ours["reward"]) == difference, where
            if server in SHARED_SERVERS:
                extra = OUR_EXTRA_METRICS.get(server, set())
                row = rows[task_index]
                theirs_metrics, ours_metrics = _metrics(theirs["verify"], row), _metrics(ours["verify"], row)
                assert set(ours_metrics) - set(theirs_metrics) == extra, where
                assert theirs_metrics == {k: v for k, v in ours_metrics.items() if k not in extra}, where
                # Ours echoes every field of the row back (row fields are kept, declared or not);
                # theirs echoes only the fields its request model declares.
                assert all(ours["verify"][k] == v for k, v in row.items() if k != "responses_create_params")
                if server == "example_session_state_mgmt":
                    assert "initial_count" not in theirs["verify"] and "initial_count" in ours["verify"]
                if server == "example_multi_step":
                    assert theirs["verify"]["parsed_synonym_values"] == ours["verify"]["parsed_synonym_values"]
                if server == "example_single_tool_call":
                    calls = sum(1 for item in ours_env.unwrapped.response.output if item.type == "function_call")
                    assert ours["verify"]["num_tool_calls"] == calls == (1 if correct else 0)
            else:  # mcqa: another engineer's server with its own metric set; the answer read must match
                assert theirs["verify"]["extracted_answer"] == ours["verify"]["extracted_answer"], where
    finally:
        theirs_env.close()
        ours_env.close()
