"""In-process tests of ``retail_support``: the store's rules, the scripted customer and agent, the score."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from nemo_gym_env.protocol.types import make_response
from nemo_gym_env.server.testing import app_client, assistant_message, example_rows, play_steps, server_config
from nemo_gym_env.servers.retail_support import app as app_module
from nemo_gym_env.servers.retail_support import make_dataset as dataset_module
from nemo_gym_env.servers.retail_support import scripted, store
from nemo_gym_env.servers.retail_support.app import RetailSupportServer
from nemo_gym_env.servers.retail_support.make_dataset import GOALS, make_dataset

NAME = "retail_support"
HERE = Path(__file__).resolve().parent.parent
ROWS = example_rows(HERE)


@pytest.fixture
def client():
    with app_client(RetailSupportServer, {}, name=NAME) as c:
        yield c


def step(client, row: dict, items: list[dict], status: int = 200) -> dict:
    reply = client.post("/step", json={**row, "response": make_response(items).model_dump(mode="json")})
    assert reply.status_code == status, reply.text
    return reply.json()


def call(name: str, arguments: dict | str) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "call_id": "c1", "name": name, "arguments": text}


def test_config_data_and_doctests():
    assert server_config(HERE, NAME)["user"] == "scripted"
    assert [row["goal"]["kind"] for row in ROWS] == list(GOALS) * 2
    assert ROWS == make_dataset(6, seed=0, split="train")
    for module in (app_module, dataset_module, scripted, store):
        assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("index", range(len(ROWS)))
def test_scripted_agent_meets_the_goal_and_the_customer_speaks_twice(client, index):
    row = ROWS[index]
    rewards, last = play_steps(client, row, scripted.scripted_action, correct=True)
    assert sum(rewards) == 1.0 and last["terminated"] and not last["truncated"]
    info = last["info"]
    assert info["state"] == 1.0 and info["informed"] == 1.0 and info["ended_by"] == "user"
    assert info["user_turns"] >= 2 and info["tool_calls"] >= 2
    assert info["user_usage"] == {"input_tokens": 0, "output_tokens": 0}  # scripted: no model
    said = info["conversation"]
    assert said[0] == {"role": "user", "text": row["user"]["opening"]} and said[-1]["role"] == "user"
    assert "###STOP###" not in json.dumps(said) and info["user_said_last"] == said[-1]["text"]


@pytest.mark.parametrize("index", range(3))
def test_a_wrong_action_scores_zero(client, index):
    row = ROWS[index]
    rewards, last = play_steps(client, row, scripted.scripted_action, correct=False)
    assert sum(rewards) == 0.0 and last["terminated"]
    if row["goal"]["kind"] == "where":
        assert last["info"]["state"] == 1.0 and last["info"]["informed"] == 0.0  # a wrong tracking number
    else:
        assert last["info"]["state"] == 0.0


def test_details_are_given_only_when_asked(client):
    row = ROWS[0]
    assert client.post("/reset", json=row).json()["observation"] == row["user"]["opening"]
    vague = step(client, row, [assistant_message("How can I help?")])
    assert vague["observation"] == row["user"]["fallback"] and "@" not in vague["observation"]
    email = step(client, row, [assistant_message("What is your email?")])
    assert email["observation"] == row["user"]["details"][0]["say"]
    again = step(client, row, [assistant_message("Your email again?")])
    assert again["observation"] == row["user"]["fallback"]  # a detail is given once


def test_the_store_enforces_its_rules_and_answers_bad_calls_in_words(client):
    row = ROWS[0]  # cancel a pending order
    order_id = row["goal"]["order_id"]
    client.post("/reset", json=row)
    outputs = lambda reply: [json.loads(out["output"]) for out in reply["info"]["tool_outputs"]]
    assert "identify the customer first" in outputs(step(client, row, [call("cancel_order", {"order_id": order_id})]))[0]["error"]
    email = row["store"]["customers"][row["goal"]["customer_id"]]["email"]
    step(client, row, [call("find_customer_by_email", {"email": email.upper()})])
    refused = outputs(step(client, row, [call("refund_order", {"order_id": order_id})]))[0]
    assert "only a delivered order can be refunded" in refused["error"]
    for bad, why in ((call("get_order", "{not json"), "not JSON"), (call("get_order", "[1]"), "not a JSON object"),
                     (call("get_order", {"order_id": 7}), "must be a non-empty string"),
                     (call("drop_tables", {}), "unknown tool"), (call("get_order", {"order_id": "#W0"}), "no order")):
        assert why in outputs(step(client, row, [bad]))[0]["error"]
    many = outputs(step(client, row, [call("get_order", {"order_id": order_id})] * 20))
    assert sum("at most 16 tool calls" in str(out) for out in many) == 4


def test_hostile_rows_are_refused_with_a_clear_error(client):
    row = ROWS[0]
    for broken, why in (({**row, "user": None}, "user"), ({**row, "user": {"opening": ""}}, "opening"),
                        ({**row, "store": {"customers": {}, "orders": {}}}, "products"),
                        ({**row, "store": {**row["store"], "customers": {f"C{n}": {"name": "x", "email": "e", "orders": []}
                                                                          for n in range(500)}}}, "customers")):
        reply = client.post("/reset", json=broken)
        assert reply.status_code == 422 and why in reply.text, reply.text
    assert client.post("/step", json={**row, "response": make_response([]).model_dump(mode="json")}).status_code == 409


def test_sessions_are_isolated(client):
    row = ROWS[0]
    with app_client(RetailSupportServer, {}, name=NAME) as other:
        client.post("/reset", json=row)
        other.post("/reset", json=row)
        email = row["store"]["customers"][row["goal"]["customer_id"]]["email"]
        step(client, row, [call("find_customer_by_email", {"email": email})])
        cancelled = step(client, row, [call("cancel_order", {"order_id": row["goal"]["order_id"]})])
        assert json.loads(cancelled["info"]["tool_outputs"][0]["output"])["status"] == "cancelled"
        # The other session's store is its own copy: its customer is not identified, its order untouched.
        step(other, row, [call("find_customer_by_email", {"email": email})])
        order = json.loads(step(other, row, [call("get_order", {"order_id": row["goal"]["order_id"]})])
                           ["info"]["tool_outputs"][0]["output"])
        assert order["status"] == "pending"


def test_the_turn_limit_ends_and_scores_the_talk():
    row = ROWS[2]
    with app_client(RetailSupportServer, {"max_user_turns": 2}, name=NAME) as client:
        client.post("/reset", json=row)
        assert not step(client, row, [assistant_message("Hello.")])["terminated"]
        last = step(client, row, [assistant_message("Hello?")])
        assert last["terminated"] and last["reward"] == 0.0 and last["info"]["ended_by"] == "turn_limit"


def test_train_and_heldout_never_share_a_customer():
    emails = {split: {c["email"] for r in make_dataset(60, seed=3, split=split) for c in r["store"]["customers"].values()}
              for split in ("train", "heldout")}
    assert emails["train"] and not emails["train"] & emails["heldout"]
    with pytest.raises(ValueError, match="split"):
        make_dataset(1, split="test")


def test_an_oversized_agent_message_is_answered_and_kept_bounded(client):
    row = ROWS[0]
    client.post("/reset", json=row)
    huge = "What is your email? " + "blah " * 400_000  # 2 MB of text in one turn
    reply = step(client, row, [assistant_message(huge)])
    assert reply["observation"] == row["user"]["details"][0]["say"]
    for text in ("Which order number?", "Shall I cancel it?"):
        step(client, row, [assistant_message(text)])
    last = step(client, row, [assistant_message("It has been cancelled.")])
    said = last["info"]["conversation"]
    assert last["terminated"] and max(len(line["text"]) for line in said) <= 4000
