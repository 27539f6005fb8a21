"""A server written for NeMo Gym runs on our base class after renaming the modules it imports.

Needs no NeMo Gym install: the fixture server (``tests/fixtures/servers/ng_style_server/app.py``,
written in NeMo Gym's style) is copied, only its import lines are rewritten, and it is launched
with our Launcher and played through our Env (docs/porting.md).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import gymnasium as gym
import pytest

import nemo_gym_env  # noqa: F401  (registers the ids)

from .players import play_episode, shopping_cart
from .porting import FIXTURE

pytestmark = pytest.mark.interop


def test_port_changes_only_import_lines(ported_server: Path) -> None:
    original = (FIXTURE / "app.py").read_text().splitlines()
    ported = (ported_server / "app.py").read_text().splitlines()
    diff = list(difflib.ndiff(original, ported))
    assert [line[2:] for line in diff if line.startswith("- ")] == [
        "from nemo_gym.base_resources_server import (",
        "from nemo_gym.server_utils import SESSION_ID_KEY",
    ]
    assert [line[2:] for line in diff if line.startswith("+ ")] == [
        "from nemo_gym_env.server import (",
        "from nemo_gym_env.server import SESSION_ID_KEY",
    ]
    assert "nemo_gym." not in "\n".join(ported)
    assert len(original) == len(ported)


@pytest.mark.parametrize("correct", [True, False], ids=["correct", "wrong"])
def test_ported_server_plays_through_our_env(ported_server: Path, ported_url: str, correct: bool) -> None:
    dataset = ported_server / "data" / "example.jsonl"
    env = gym.make("NemoGym/Generic-v0", base_url=ported_url, dataset=str(dataset))
    try:
        for task_index in range(len(env.unwrapped.rows)):
            result = play_episode(env, shopping_cart, correct=correct, options={"task_index": task_index})
            row = env.unwrapped.task
            assert result["terminated"] and not result["truncated"], result["info"]
            assert result["reward"] == (1.0 if correct else 0.0), result["verify"]
            verify = result["verify"]
            # State kept in the server's pydantic field, keyed by request.session[SESSION_ID_KEY]:
            # reached through the signed cookie from seed_session to verify.
            assert (sorted(verify["final_items"]) == sorted(row["expected_items"])) is correct
            assert verify["num_missing_items"] + verify["num_extra_items"] == (0 if correct else 1)
            assert "failure_reason" not in verify
    finally:
        env.close()


def test_ported_server_verifier_exception_is_no_reward(ported_server: Path, ported_url: str) -> None:
    """The fixture's verifier raises on a row with no expected items: our base class answers (reward 0 with
    ``verifier_error``), not a 500, and the env takes that for what it is: no judgement, the episode truncated."""
    row = {**_first_row(ported_server), "initial_items": [], "expected_items": []}
    env = gym.make("NemoGym/Generic-v0", base_url=ported_url, dataset=[row])
    try:
        env.reset(seed=0)
        _, reward, terminated, truncated, info = env.step("Nothing to buy.")
        assert (reward, terminated, truncated) == (0.0, False, True)
        assert info["failure_kind"] == "verifier_error" and info["mask_sample"] is True
        assert "ZeroDivisionError" in info["failure_reason"]
    finally:
        env.close()


def _first_row(folder: Path) -> dict:
    return json.loads((folder / "data" / "example.jsonl").read_text().splitlines()[0])
