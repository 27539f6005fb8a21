"""The bridge's Gymnasium server in process: seeds, text, actions, unreadable turns, envs that raise, closing."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer
from nemo_gym_env.bridge.targets import check_hosted, target_config
from nemo_gym_env.errors import ConfigError
from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import app_client, assistant_message

ROW = {"responses_create_params": {"input": [{"role": "system", "content": "play"}]}}
HERE = __name__


def say(text: str) -> dict:
    return make_response([assistant_message(text)]).model_dump(mode="json")


def reset(client, row: dict) -> dict:
    reply = client.post("/reset", json=row)
    assert reply.status_code == 200, reply.text
    return reply.json()


def step(client, row: dict, text: str) -> dict:
    reply = client.post("/step", json={**row, "response": say(text)})
    assert reply.status_code == 200, reply.text
    return reply.json()


# ---- user envs the tests host -------------------------------------------------------------------

CLOSED: list[int] = []


class Counter(gym.Env):
    """Counts to a target drawn from the seed; ``raise_at`` makes step raise there, ``raise_reset`` reset."""

    metadata: ClassVar[dict] = {"render_modes": ["ansi"]}

    def __init__(self, render_mode=None, raise_at: int | None = None, raise_reset: bool = False):
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(3, start=-1)
        self.observation_space = spaces.Discrete(100)
        self.raise_at, self.raise_reset = raise_at, raise_reset

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.raise_reset:
            raise RuntimeError("cannot deal the cards")
        self.value, self.target, self.steps = 0, int(self.np_random.integers(1, 5)), 0
        return self.value, {"target": self.target}

    def step(self, action):
        self.steps += 1
        if self.raise_at is not None and self.steps >= self.raise_at:
            raise ValueError("the counter jammed")
        self.value += int(action)
        done = self.value == self.target
        return self.value, float(done), done, self.steps >= 10, {"value": np.int64(self.value)}

    def render(self):
        return f"\x1b[31mvalue\x1b[0m {self.value}"

    def close(self):
        CLOSED.append(id(self))


class Words(gym.Env):
    """A Text action space: reward 1 for the word ``open``."""

    def __init__(self):
        self.action_space = spaces.Text(max_length=12, charset="abcdefghijklmnopqrstuvwxyz")
        self.observation_space = spaces.Box(0, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.ones(2, np.float32), float(action == "open"), True, False, {}


def describe_counter(env, observation, info) -> str:
    return f"The counter shows {observation}; reach {env.target}."


@pytest.fixture
def counter():
    with app_client(GymnasiumEnvServer, {"env_id": f"{HERE}:Counter", "action_names": ["down", "stay", "up"],
                                         "invalid_penalty": -0.5, "max_invalid_turns": 3}, name="counter") as c:
        yield c


def test_same_row_and_seed_same_episode_and_the_env_is_the_raw_one(counter):
    first = reset(counter, {**ROW, "seed": 11})
    again = reset(counter, {**ROW, "seed": 11})
    raw = Counter()
    _, info = raw.reset(seed=11)
    assert first == again and first["info"]["target"] == info["target"] and first["info"]["seed"] == 11
    assert "value 0" in first["observation"] and "\x1b" not in first["observation"]  # ansi, colours removed
    assert "Actions: down (-1), stay (0), up (1)" in first["observation"]  # the format, stated


def test_a_row_without_seed_plays_the_same_episode_every_time(counter):
    assert reset(counter, {**ROW, "level": "a"})["info"]["seed"] == reset(counter, {**ROW, "level": "a"})["info"]["seed"]
    assert reset(counter, {**ROW, "level": "a"})["info"]["seed"] != reset(counter, {**ROW, "level": "b"})["info"]["seed"]


def test_actions_by_name_number_or_bare_word_and_step_rewards_pass_through(counter):
    target = reset(counter, {**ROW, "seed": 3})["info"]["target"]
    moves = ["<action>UP</action>", "I go <action>1</action>", "up", "<action>up</action>"][:target]
    for i, move in enumerate(moves, 1):
        reply = step(counter, ROW, move)
        assert reply["info"]["action"] == 1 and reply["info"]["action_name"] == "up" and reply["info"]["value"] == i
    assert (reply["reward"], reply["terminated"], reply["truncated"]) == (1.0, True, False)


def test_an_unreadable_turn_gets_the_format_back_and_the_penalty_and_is_not_played(counter):
    reset(counter, {**ROW, "seed": 3})
    reply = step(counter, ROW, "I think I will jump")
    assert reply["reward"] == -0.5 and not reply["terminated"] and not reply["truncated"]
    assert "no <action>...</action> tag" in reply["observation"] and "Actions: down (-1)" in reply["observation"]
    reply = step(counter, ROW, "<action>7</action>")
    assert "the numbers go from -1 to 1" in reply["info"]["invalid_action"]
    assert step(counter, ROW, "<action>up</action>")["info"]["value"] == 1  # the env saw no bad turn


def test_max_invalid_turns_in_a_row_truncates(counter):
    reset(counter, {**ROW, "seed": 3})
    replies = [step(counter, ROW, "nothing") for _ in range(3)]
    assert [r["truncated"] for r in replies] == [False, False, True]
    assert counter.post("/step", json={**ROW, "response": say("up")}).status_code == 409  # the episode ended


def test_a_step_that_raises_ends_that_episode_truncated_with_the_exception_and_the_row(counter):
    with app_client(GymnasiumEnvServer, {"env_id": f"{HERE}:Counter", "env_kwargs": {"raise_at": 2}},
                    name="jam") as jam:
        other = app_client(GymnasiumEnvServer.from_config({"env_id": f"{HERE}:Counter"}, "other"))
        reset(jam, {**ROW, "seed": 5, "level": "hard"})
        step(jam, ROW, "<action>0</action>")
        reply = step(jam, ROW, "<action>0</action>")
        assert (reply["reward"], reply["terminated"], reply["truncated"]) == (0.0, False, True)
        assert reply["info"]["exception"] == "ValueError" and "the counter jammed" in reply["info"]["error"]
        assert reply["info"]["row"] == {"level": "hard", "seed": 5}
        # the server goes on: a new episode in the same server, and another session, play on
        reset(jam, {**ROW, "seed": 5})
        assert step(jam, ROW, "<action>1</action>")["info"]["value"] == 1
        with other:
            reset(other, {**ROW, "seed": 5})
            assert step(other, ROW, "<action>1</action>")["info"]["value"] == 1


def test_a_reset_that_raises_ends_the_episode_at_its_first_step():
    with app_client(GymnasiumEnvServer, {"env_id": f"{HERE}:Counter", "env_kwargs": {"raise_reset": True}},
                    name="deal") as client:
        # building the server resets a probe env too: the failing reset only fails episodes
        first = reset(client, {**ROW, "seed": 1})
        assert "cannot deal the cards" in first["observation"] and first["info"]["exception"] == "RuntimeError"
        reply = step(client, ROW, "<action>0</action>")
        assert reply["truncated"] and reply["info"]["where"] == "reset" and reply["info"]["row"]["seed"] == 1


def test_the_env_is_closed_with_its_session_and_when_the_store_drops_it():
    from fastapi.testclient import TestClient

    with app_client(GymnasiumEnvServer, {"env_id": f"{HERE}:Counter", "max_sessions": 2}, name="c") as client:
        before = len(CLOSED)
        reset(client, {**ROW, "seed": 3})
        reset(client, {**ROW, "seed": 4})  # same cookie: the first episode's env is closed
        assert len(CLOSED) == before + 1
        target = reset(client, {**ROW, "seed": 3})["info"]["target"]
        for _ in range(target):
            reply = step(client, ROW, "<action>1</action>")
        assert reply["terminated"] and len(CLOSED) == before + 3  # reset's and the finished episode's
        closed = len(CLOSED)
        for seed in range(3):  # three more sessions with a cap of two: the oldest are dropped, their envs closed
            reset(TestClient(client.app), {**ROW, "seed": seed})
        assert len(CLOSED) == closed + 1


def test_a_user_formatter_a_text_space_and_an_array_space():
    with app_client(GymnasiumEnvServer, {"env_id": f"{HERE}:Counter",
                                         "formatter": f"{HERE}:describe_counter"}, name="f") as client:
        assert reset(client, {**ROW, "seed": 3})["observation"].startswith("The counter shows 0; reach")
    with app_client(GymnasiumEnvServer, {"env_id": f"{HERE}:Words"}, name="w") as client:
        first = reset(client, ROW)
        assert first["observation"].startswith("Observation: [0.0, 0.0]") and "as text" in first["observation"]
        assert step(client, ROW, "<action>open</action>")["reward"] == 1.0
        reset(client, ROW)
        assert "not a valid text action" in step(client, ROW, "<action>Open Sesame!</action>")["info"]["invalid_action"]


@pytest.mark.parametrize(("config", "message"), [
    ({"env_id": "NoSuchEnv-v3"}, "no Gymnasium env 'NoSuchEnv-v3'"),
    ({"env_id": "FrozenLak-v1"}, "no Gymnasium env 'FrozenLak-v1'"),
    ({"env_id": "no_such_module_xyz:Env"}, "module 'no_such_module_xyz' does not import: ModuleNotFoundError"),
    ({"env_id": f"{HERE}:describe_counter"}, "not a gymnasium.Env subclass"),
    ({"env_id": "FrozenLake-v1", "action_names": ["a", "b"]}, "action_names has 2 names"),
    ({"env_id": "FrozenLake-v1", "formatter": "json:nothing_here"}, "module 'json' has no 'nothing_here'"),
    ({"env_id": "FrozenLake-v1", "env_kwargs": {"map_name": "9x9"}}, "gym.make('FrozenLake-v1') failed: KeyError"),
])
def test_a_wrong_env_fails_at_start_in_one_line(config, message):
    with pytest.raises(ConfigError) as caught:
        check_hosted("bad", {**next(iter(next(iter(target_config("gymnasium:X").values()))
                                          ["resources_servers"].values())), **config})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_seed_that_is_not_an_integer_is_a_422(counter):
    for seed in ("7", -1, 2**64, True, 1.5):
        reply = counter.post("/reset", json={**ROW, "seed": seed})
        assert reply.status_code == 422 and "seed" in reply.text, reply.text
