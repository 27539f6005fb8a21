"""NeMo Gym's own example rows on our same-named servers, and ours in NeMo Gym's row formats.

``tests/fixtures/nemo_gym_data/<server>.jsonl`` is NeMo Gym 0.7.0's ``data/example.jsonl`` of each
server that has a bundled server of the same name here (copied unchanged; see the README
there). Every row must be accepted by ``/seed_session`` and ``/verify``, and our scripted
player, playing from the row's ground truth, must get 1.0 right and 0.0 wrong, as NeMo Gym's
server gives. These need no NeMo Gym install: the servers run in process.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_env.launch.catalog import bundled_servers
from nemo_gym_env.protocol.scripting import assistant_message
from nemo_gym_env.server import SimpleResourcesServer
from nemo_gym_env.server.testing import app_client, example_rows, play, verify

from ..fixtures import FIXTURES

THEIR_ROWS = FIXTURES / "nemo_gym_data"
SHARED = sorted(path.stem for path in THEIR_ROWS.glob("*.jsonl"))


def their_rows(server: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (THEIR_ROWS / f"{server}.jsonl").read_text().splitlines() if line.strip()]


def server_class(server: str) -> type:
    module = importlib.import_module(f"nemo_gym_env.servers.{server}.app")
    return next(value for value in vars(module).values() if isinstance(value, type)
                and issubclass(value, SimpleResourcesServer) and value.__module__ == module.__name__)


def player(server: str):
    return importlib.import_module(f"nemo_gym_env.servers.{server}.scripted").scripted_action


def test_every_same_named_server_has_their_rows():
    assert set(SHARED) == {"code_gen", "example_multi_step", "example_session_state_mgmt",
                           "example_single_tool_call", "instruction_following", "mcqa", "reasoning_gym"}
    assert set(SHARED) <= set(bundled_servers())


IFBENCH_FAMILIES = {"last_word", "count", "first_word", "letters", "paragraphs"}
"""Instruction families of NeMo Gym's instruction_following rows (IFBench's) that ours does not implement."""


@pytest.mark.parametrize("server", SHARED)
def test_their_example_rows_are_accepted_and_score_as_theirs(server):
    unsupported = set()
    with app_client(server_class(server), {}, name=server) as client:
        for index, row in enumerate(their_rows(server)):
            assert client.post("/seed_session", json=row).status_code == 200, (server, index)
            right = play(client, row, player(server), correct=True)
            wrong = play(client, row, player(server), correct=False)
            assert wrong["reward"] == 0.0, (server, index)
            if right.get("failure_kind") == "invalid_instruction":
                # Accepted, scored 0 and said so: an instruction id our server does not implement.
                assert server == "instruction_following" and right["reward"] == 0.0
                unsupported.add(right["failure_reason"].split("'")[1].split(":")[0])
                continue
            assert right["reward"] == 1.0, (server, index, {k: v for k, v in right.items() if k != "response"})
    assert unsupported <= (IFBENCH_FAMILIES if server == "instruction_following" else set())


def test_reasoning_gym_scores_their_rows_against_the_entry_they_carry():
    rows = their_rows("reasoning_gym")
    assert all("task_name" not in row and row["metadata"]["source_dataset"] for row in rows)
    server = "reasoning_gym"
    with app_client(server_class(server), {}, name=server) as client:
        reply = verify(client, rows[0], [assistant_message(f"<answer>{rows[0]['answer']}</answer>")])
        assert (reply["reward"], reply["task_name"]) == (1.0, "knights_knaves")
        missing = {k: v for k, v in rows[0].items() if k != "metadata"}
        refused = client.post("/verify", json={**missing, "response": reply["response"]})
        assert refused.status_code == 422 and "source_dataset" in refused.text
        half = {**rows[0], "task_name": "knights_knaves"}  # task_* fields come together or not at all
        refused = client.post("/verify", json={**half, "response": reply["response"]})
        assert refused.status_code == 422 and "go together" in refused.text


def test_our_reasoning_gym_rows_are_in_their_format_too():
    """Ours name the entry (task_*) and also carry NeMo Gym's ``answer`` and ``metadata``; either form scores."""
    rows = example_rows(bundled_servers()["reasoning_gym"])
    server = "reasoning_gym"
    with app_client(server_class(server), {}, name=server) as client:
        for row in rows:
            assert "answer" in row and row["metadata"]["source_dataset"] == row["task_name"]
            theirs = {k: v for k, v in row.items() if not k.startswith("task_")}
            for form in (row, theirs):
                right = play(client, form, player(server), correct=True)
                assert right["reward"] == 1.0, (row["task_name"], right.get("failure_reason"))


def test_our_mcqa_rows_give_options_as_nemo_gyms_list_of_one_key_dicts():
    for row in example_rows(bundled_servers()["mcqa"]):
        options = row["options"]
        assert isinstance(options, list) and all(isinstance(o, dict) and len(o) == 1 for o in options)
    theirs = their_rows("mcqa")[0]
    assert isinstance(theirs["options"], list)  # the shape the check above holds ours to


def test_their_rows_are_unchanged_copies():
    # The fixture files are NeMo Gym's, byte for byte: each line is one JSON row, five rows each.
    for server in SHARED:
        text = (THEIR_ROWS / f"{server}.jsonl").read_text()
        assert len([line for line in text.splitlines() if line.strip()]) == 5
    assert Path(THEIR_ROWS / "README.md").read_text().count("Apache License") == 1
