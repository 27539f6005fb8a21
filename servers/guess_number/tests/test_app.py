"""In-process tests of the ``guess_number`` server (a Gymnasium-protocol server) and its scripted player."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import app_client, assistant_message, example_rows, play_steps, server_config
from nemo_gym_env.servers.guess_number import app as app_module
from nemo_gym_env.servers.guess_number import scripted
from nemo_gym_env.servers.guess_number.app import INVALID_PENALTY, GuessNumberServer

NAME = "guess_number"
HERE = Path(__file__).resolve().parent.parent
ROWS = example_rows(HERE)


@pytest.fixture
def client():
    with app_client(GuessNumberServer, {}, name=NAME) as c:
        yield c


def say(text: str) -> dict:
    return make_response([assistant_message(text)]).model_dump(mode="json")


def start(client, row: dict) -> dict:
    reply = client.post("/reset", json=row)
    assert reply.status_code == 200, reply.text
    return reply.json()


def guess(client, row: dict, text: str) -> dict:
    reply = client.post("/step", json={**row, "response": say(text)})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_config_and_data():
    assert server_config(HERE, NAME)["domain"] == "games"
    assert len(ROWS) == 5
    for row in ROWS:
        assert row["low"] <= row["target"] <= row["high"]
        assert row["high"] - row["low"] + 1 > row["max_guesses"] + 1  # wrong play can always avoid the target


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_play_wins_at_once_or_never(client, index):
    rewards, last = play_steps(client, ROWS[index], scripted.scripted_action, correct=True)
    assert rewards == [1.0] and last["info"]["result"] == "win"
    rewards, last = play_steps(client, ROWS[index], scripted.scripted_action, correct=False)
    assert rewards == [0.0] * ROWS[index]["max_guesses"]
    assert last["terminated"] and last["info"]["result"] == "lost" and last["info"]["last"] != "invalid"


def test_hints_and_per_step_rewards(client):
    row = ROWS[0]  # 1..20, target 13, 5 guesses
    assert start(client, row)["observation"] == (
        "I am thinking of a whole number from 1 to 20. You have 5 guesses. Answer with <guess>N</guess>.")
    step = guess(client, row, "<guess>10</guess>")
    assert (step["reward"], step["terminated"], step["info"]["result"]) == (0.0, False, "higher")
    assert step["observation"] == "Higher. The number is from 11 to 20. 4 guesses left."
    step = guess(client, row, "<guess>5</guess>")  # ruled out by the hint
    assert (step["reward"], step["info"]["result"]) == (INVALID_PENALTY, "invalid")
    assert step["observation"].startswith("5 cannot be it.")
    step = guess(client, row, "thirteen?")
    assert step["reward"] == INVALID_PENALTY and step["observation"].startswith("No <guess>N</guess>")
    step = guess(client, row, "<guess>15</guess> ... no: <guess>13</guess>")  # the last tag counts
    assert (step["reward"], step["terminated"], step["truncated"], step["observation"]) == (1.0, True, False, None)
    assert step["info"] == {"guess": 13, "guesses_used": 4, "guesses_left": 1, "result": "win"}


def test_the_last_missed_guess_ends_the_game(client):
    row = {**ROWS[0], "max_guesses": 1}
    start(client, row)
    step = guess(client, row, "<guess>99</guess>")
    assert (step["reward"], step["terminated"]) == (INVALID_PENALTY, True)
    assert step["info"]["result"] == "lost" and step["info"]["target"] == 13


def test_a_step_after_the_end_is_refused(client):
    start(client, ROWS[0])
    guess(client, ROWS[0], "<guess>13</guess>")
    assert client.post("/step", json={**ROWS[0], "response": say("<guess>13</guess>")}).status_code == 409


@pytest.mark.parametrize("change", [{"target": 0}, {"low": "one"}, {"target": None}, {"max_guesses": 0},
                                    {"high": 10**12}])
def test_rows_the_game_cannot_be_played_from_are_a_422(client, change):
    row = {**ROWS[0], **change}
    reply = client.post("/reset", json=row)
    assert reply.status_code == 422, reply.text
    assert "the row needs" in reply.text


def test_a_long_answer_is_read_in_linear_time():
    from nemo_gym_env.server.testing import times_slower_than_plain

    assert times_slower_than_plain(app_module.parse_guess, "<guess>" * 30_000) < 50


def test_doctests():
    for module in (app_module, scripted):
        assert doctest.testmod(module).failed == 0
