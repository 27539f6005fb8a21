"""TextArena games served by the bridge: the same returns as TextArena itself, offline, with our opponent.

The bundled single-player games (Tower of Hanoi, Sudoku, GuessTheNumber) and Tic Tac Toe against our
scripted opponent are played by their scripted players through ``gym.make``; the moves are replayed on
``textarena.make(...)`` reset with the row's seed (the opponent's moves computed the same way), and the
player's reward from ``env.close()`` must equal the episode's return.
"""

from __future__ import annotations

import random

import gymnasium as gym
import pytest

import nemo_gym_env  # noqa: F401 - registers the ids
from nemo_gym_env.bridge.opponents import BUILTIN_OPPONENTS
from nemo_gym_env.bridge.targets import check_hosted, target_config
from nemo_gym_env.bridge.textarena_game import TextArenaServer
from nemo_gym_env.errors import ConfigError
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import app_client, assistant_message

from .playing import play_rollouts, play_vector, player, said

ta = pytest.importorskip("textarena")

GAMES = {"textarena_tower_of_hanoi": "TowerOfHanoi-v0", "textarena_sudoku": "Sudoku-v0-easy",
         "textarena_guess_the_number": "GuessTheNumber-v0", "textarena_tic_tac_toe": "TicTacToe-v0"}
ROW = {"responses_create_params": {"input": [{"role": "system", "content": "play"}]}}


def raw_reward(game: str, seed: int, moves: list[str]) -> float:
    """TextArena itself: reset with ``seed``, the model's moves as player 0, our opponent as player 1."""
    env = ta.make(f"{game}-raw")
    players = 2 if game.startswith("TicTacToe") else 1
    env.reset(num_players=players, seed=seed)
    moves = list(moves)
    done = False
    while not done:
        player, _ = env.get_observation()
        move = moves.pop(0) if player == 0 else BUILTIN_OPPONENTS["TicTacToe"]("", env)
        done, _ = env.step(action=move)
    assert not moves, "the raw game ended before the moves did"
    rewards, _ = env.close()
    return float(rewards[0])


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("server", sorted(GAMES))
def test_gym_make_returns_textarenas_own_reward_seed_by_seed(server):
    play = player(server)
    env = gym.make(f"NemoGym/{server}-v0", max_steps=120)
    try:
        for seed in range(3):
            obs, _ = env.reset(seed=seed)
            seen, moves, total = said(obs), [], 0.0
            while True:
                turn = play({}, [], observations=seen)
                moves.append(turn[0]["content"][0]["text"])
                obs, reward, terminated, truncated, info = env.step(turn)
                total += reward
                seen += said(obs)
                if terminated or truncated:
                    break
            assert terminated and not truncated
            assert total == raw_reward(GAMES[server], env.unwrapped.last_verify["seed"], moves)
            expected = 0.0 if server == "textarena_tic_tac_toe" else 1.0  # solved; a draw against our opponent
            assert total == expected, (server, seed, info.get("reason"))
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("server", ["textarena_tower_of_hanoi", "textarena_guess_the_number", "textarena_tic_tac_toe"])
def test_the_vector_env_returns_textarenas_own_rewards(server):
    for episode in play_vector(server, 3, 50, 120):
        assert episode["end"] == (True, False)
        assert episode["return"] == raw_reward(GAMES[server], episode["seed"], episode["moves"])


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_rollouts_rows_hold_textarenas_own_rewards(tmp_path):
    rows = play_rollouts(sorted(GAMES), tmp_path / "rollouts.jsonl", 120)
    assert len(rows) == 8 * len(GAMES)
    for row in rows:
        game = GAMES[row["agent_ref"]["name"]]
        assert row["reward"] == raw_reward(game, row["seed"], row["moves"]), (game, row["seed"])
        assert (row["terminated"], row["truncated"]) == (True, False)


def test_interleaved_sessions_draw_the_same_games_as_alone():
    """TextArena seeds Python's global random: each game keeps its own, so interleaving changes nothing."""
    from fastapi.testclient import TestClient

    def first_board(client, seed):
        return client.post("/reset", json={**ROW, "seed": seed}).json()["observation"]

    with app_client(TextArenaServer, {"game": "Sudoku-v0-easy"}, name="sudoku") as client:
        alone = first_board(client, 5)
        other = TestClient(client.app)
        first_board(other, 6)
        random.seed(999)  # the process's own random is not the game's
        interleaved = first_board(TestClient(client.app), 5)
        assert interleaved == alone and first_board(other, 6) != alone


def test_moves_are_read_from_the_tag_or_the_whole_turn_and_an_empty_turn_is_not_played():
    with app_client(TextArenaServer, {"game": "TowerOfHanoi-v0", "invalid_penalty": -0.25}, name="hanoi") as client:
        client.post("/reset", json={**ROW, "seed": 0})

        def move(text: str) -> dict:
            return client.post("/step", json={**ROW, "response": make_response([assistant_message(text)])
                                              .model_dump(mode="json")}).json()

        assert "moved disk 1 from A to C" in move("I move the small disk. <action>[A C]</action>")["observation"]
        assert "moved disk 2 from A to B" in move("[A B]")["observation"]
        empty = move("   ")
        assert empty["reward"] == -0.25 and empty["info"]["invalid_action"] == "your answer was empty"


def test_a_two_player_game_against_a_policy_of_ours(tmp_path):
    """``opponent: module:function`` is any policy of ours; here one that always takes the lowest free cell."""
    with app_client(TextArenaServer, {"game": "TicTacToe-v0", "player": 1,
                                      "opponent": f"{__name__}:lowest_free_cell"}, name="ttt") as client:
        first = client.post("/reset", json={**ROW, "seed": 0}).json()
        assert first["info"]["players"] == 2 and "placed their symbol (O) in cell 0" in first["observation"]


def lowest_free_cell(observation: str, env) -> str:
    board = env.state.game_state["board"]
    return f"[{next(i for i in range(9) if not board[i // 3][i % 3])}]"


@pytest.mark.parametrize(("game", "message"), [
    ("Wordle-v0", "needs data from the network"),
    ("Hangman-v0", "needs data from the network"),
    ("Chess-v0", "failed to start: SyntaxError"),
    ("TowerOfHanoi-v9", "TextArena has no game 'TowerOfHanoi-v9'; did you mean TowerOfHanoi-v0"),
    ("ConnectFour-v0", "two-player game with no builtin opponent"),
])
def test_a_game_that_cannot_run_here_fails_at_start_in_one_line(game, message):
    ((instance, block),) = target_config(f"textarena:{game}").items()
    with pytest.raises(ConfigError) as caught:
        check_hosted(instance, next(iter(block["resources_servers"].values())))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("game", ["TowerOfHanoi-v0", "Sudoku-v0", "Minesweeper-v0", "GuessTheNumber-v0",
                                  "Crosswords-v0", "FifteenPuzzle-v0", "TicTacToe-v0", "ConnectFour-v0", "Nim-v0"])
def test_games_that_run_offline_start(game):
    settings = {} if game != "ConnectFour-v0" and game != "Nim-v0" else {"opponent": f"{__name__}:lowest_free_cell"}
    ((instance, block),) = target_config(f"textarena:{game}", **settings).items()
    server = check_hosted(instance, next(iter(block["resources_servers"].values())))
    assert server is not None


def test_the_opponent_can_be_a_model_behind_an_openai_compatible_endpoint():
    """``opponent: policy``: our OpenAI-compatible policy plays the other side over real HTTP (a scripted
    endpoint whose answer is no move: TextArena gives the turn back, then rules it out)."""
    from tests.fixtures.openai_server import running_server

    with running_server() as base_url, app_client(TextArenaServer, {
            "game": "TicTacToe-v0", "opponent": "policy",
            "opponent_policy": {"kind": "openai", "base_url": base_url, "model": "opponent-ttt", "api": "chat"}},
            name="ttt_model") as client:
        client.post("/reset", json={**ROW, "seed": 0})
        reply = client.post("/step", json={**ROW, "response": make_response([assistant_message("[4]")])
                                           .model_dump(mode="json")}).json()
        assert "[Player 1] Done" in reply["observation"]  # the model's own words, as the game relays them
        assert (reply["reward"], reply["terminated"]) == (1.0, True) and reply["info"]["opponent_moves"] >= 1
