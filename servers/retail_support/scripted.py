"""Deterministic scripted agent for ``retail_support`` (tests, baselines, the no-model demo).

Not a model: it reads the row's ``goal`` and ``store`` and plays the conversation the policy asks
for, one turn per answer it got (the turn is the number of tool outputs and customer messages in
``history``): ask for the email, look the customer up, ask for the order number, read the order,
then per goal: ``cancel`` (ask to confirm, cancel, say so), ``exchange`` (ask which item, find the
variant, ask to confirm, exchange, say so), ``where`` (tell the status and tracking number).
Against the scripted customer every conversation ends with the goal met (reward 1.0) and the
customer speaking at least twice after the opening request.

With ``correct=False`` it takes a wrong action instead of the goal's (``refund_order``; the store
refuses it on a pending order) and then says the goal is done; on ``where`` it gives a wrong
tracking number. The end state, or what the customer was told, is then not the goal's: reward 0.

Example:
    >>> from nemo_gym_env.servers.retail_support.make_dataset import make_dataset
    >>> row = make_dataset(1)[0]
    >>> scripted_action(row, [])[0]["content"][0]["text"]
    'I can help with that. What is the email on your account?'
    >>> scripted_action(row, [{}])[0]["name"]
    'find_customer_by_email'
"""

from __future__ import annotations

from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message, function_call

__all__ = ["script", "scripted_action"]


def script(row: dict[str, Any], correct: bool = True) -> list[tuple[Any, ...]]:
    """Every turn of the scripted agent for ``row``, in order: ``("say", text)`` or ``("call", name, arguments)``."""
    goal, store = row["goal"], row["store"]
    order_id, customer = goal["order_id"], store["customers"][goal["customer_id"]]
    order = store["orders"][order_id]
    turns = [
        _say("I can help with that. What is the email on your account?"),
        _call("find_customer_by_email", {"email": customer["email"]}),
        _say(f"Thank you, {customer['name'].split()[0]}. Which order is it about? "
                          "Please give me the order number."),
        _call("get_order", {"order_id": order_id}),
    ]
    if not correct:
        wrong = (f"Order {order_id} is on its way; its tracking number is 1Z00000000." if goal["kind"] == "where"
                 else f"Done: order {order_id} has been cancelled and your exchange has been requested.")
        return [*turns, _call("refund_order", {"order_id": order_id}), _say(wrong)]
    if goal["kind"] == "cancel":
        return [*turns, _say(f"Order {order_id} is pending, so I can cancel it. Shall I cancel it now?"),
                _call("cancel_order", {"order_id": order_id}),
                _say(f"Order {order_id} has been cancelled.")]
    if goal["kind"] == "exchange":
        products = store["products"]
        old, new = (f"{products[p]['variant']} {products[p]['name'].lower()}"
                    for p in (goal["product_id"], goal["new_product_id"]))
        return [*turns, _say("Which item would you like to exchange, and for which variant?"),
                _call("find_product", {"name": goal["new_product_words"]}),
                _say(f"I can exchange the {old} of order {order_id} for the {new}. Shall I go ahead?"),
                _call("exchange_item", {"order_id": order_id, "product_id": goal["product_id"],
                                                "new_product_id": goal["new_product_id"]}),
                _say(f"Done: your exchange has been requested; the {new} will be sent to you.")]
    return [*turns, _say(f"Order {order_id} has shipped. Its tracking number is "
                                      f"{order['tracking_number']}.")]


def _say(text: str) -> tuple[str, ...]:
    return ("say", text)


def _call(name: str, arguments: dict[str, Any]) -> tuple[Any, ...]:
    return ("call", name, arguments)


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True) -> list[dict[str, Any]]:
    """The next turn: the script's turn number ``len(history)`` (the last again past its end)."""
    turns = script(row, correct)
    k = min(len(history), len(turns) - 1)
    kind, *what = turns[k]
    return [assistant_message(what[0])] if kind == "say" else [function_call(len(history), 0, *what)]
