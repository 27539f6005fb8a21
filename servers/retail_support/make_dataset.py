"""Write ``retail_support`` rows from a seed; train and held-out rows never share a customer.

Example:
    >>> train = make_dataset(30, seed=0, split="train")
    >>> heldout = make_dataset(30, seed=0, split="heldout")
    >>> emails = lambda rows: {c["email"] for r in rows for c in r["store"]["customers"].values()}
    >>> emails(train) & emails(heldout)
    set()
    >>> [row["goal"]["kind"] for row in train[:3]]
    ['cancel', 'exchange', 'where']

From a shell::

    python -m nemo_gym_env.servers.retail_support.make_dataset --size 500 --seed 0 --split train --out train.jsonl

Each row's store has three customers (the one who writes, two others) with one to three orders
each and a catalog of product variants. Customer numbers 1000-4999 are the train split's,
5000-8999 the held-out split's, and a customer's email holds the number, so no held-out row
shares a customer (or an order, whose id holds it too) with a train row. Rows take turns between
the goals (``cancel`` a pending order, ``exchange`` an item of a delivered order for an in-stock
variant, ``where`` is a shipped parcel); the customer gives their email, the order number and
the item only when asked.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from typing import Any

from nemo_gym_env.protocol.dataset import write_rows
from nemo_gym_env.servers.retail_support.store import POLICY, TOOLS

__all__ = ["GOALS", "SPLITS", "main", "make_dataset"]

GOALS = ("cancel", "exchange", "where")
SPLITS = {"train": range(1000, 5000), "heldout": range(5000, 9000)}

FIRST = ["Ana", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Luis", "Maya",
         "Nadia", "Omar", "Petra", "Rosa", "Sami"]
FAMILY = ["Silva", "Okafor", "Tanaka", "Novak", "Haddad", "Mensah", "Rossi", "Nguyen", "Petrov", "Ibarra", "Dubois",
          "Costa", "Larsen", "Sato"]
CATALOG = [("Mug", ("blue", "red", "green"), 12.0), ("T-shirt", ("small", "medium", "large"), 20.0),
           ("Headphones", ("black", "white"), 80.0), ("Backpack", ("grey", "navy"), 45.0),
           ("Desk lamp", ("brass", "black"), 35.0), ("Water bottle", ("steel", "orange"), 18.0)]


def _products(rng: random.Random) -> dict[str, dict[str, Any]]:
    products, number = {}, 1
    for name, variants, price in CATALOG:
        for variant in variants:
            products[f"P{number:02d}"] = {"name": name, "variant": variant, "price": price,
                                          "in_stock": rng.random() < 0.7}
            number += 1
    return products


def _customer(rng: random.Random, number: int, products: dict[str, Any], statuses: list[str]) -> tuple[dict, dict]:
    name = f"{rng.choice(FIRST)} {rng.choice(FAMILY)}"
    customer_id = f"C{number}"
    orders = {}
    for k, status in enumerate(statuses):
        order_id = f"#W{number}{k + 1:03d}"
        tracking = f"1Z{rng.randrange(16 ** 8):08X}" if status in ("shipped", "delivered") else None
        items = rng.sample(sorted(products), rng.randint(1, 2))
        orders[order_id] = {"customer_id": customer_id, "status": status, "items": items, "tracking_number": tracking}
    email = f"{name.lower().replace(' ', '.')}.{number}@example.com"
    return {customer_id: {"name": name, "email": email, "orders": list(orders)}}, orders


def _row(goal: str, rng: random.Random, numbers: list[int]) -> dict[str, Any]:
    products = _products(rng)
    need = {"cancel": "pending", "exchange": "delivered", "where": "shipped"}[goal]
    customers, orders = {}, {}
    for n, number in enumerate(numbers):
        statuses = [rng.choice(["pending", "shipped", "delivered"]) for _ in range(rng.randint(1, 3))]
        if n == 0:
            statuses[rng.randrange(len(statuses))] = need
        people, placed = _customer(rng, number, products, statuses)
        customers.update(people)
        orders.update(placed)
    me = f"C{numbers[0]}"
    order_id = rng.choice([oid for oid, order in orders.items() if order["customer_id"] == me and order["status"] == need])
    order = orders[order_id]
    email = customers[me]["email"]
    details = [{"asked_by": ["email"], "say": f"It's {email}."},
               {"asked_by": ["order number", "order id", "which order"], "say": f"The order number is {order_id}."}]
    goal_fields: dict[str, Any] = {"kind": goal, "customer_id": me, "order_id": order_id}
    expected: dict[str, Any] = {"orders": {}, "must_say": []}
    if goal == "cancel":
        user = {"opening": "Hi, I'd like to cancel an order, please.",
                "goal": f"Cancel order {order_id}: you ordered it by mistake.", "done_by": ["cancelled", "canceled"],
                "fallback": "I'd like to cancel an order I placed by mistake."}
        expected["orders"][order_id] = {**order, "status": "cancelled"}
    elif goal == "exchange":
        old = rng.choice(order["items"])  # every product of the catalog has another variant
        options = [pid for pid, p in products.items()
                   if p["name"] == products[old]["name"] and pid != old]
        new = rng.choice(options)
        products[new]["in_stock"] = True
        old_text, new_text = (f"{products[p]['variant']} {products[p]['name'].lower()}" for p in (old, new))
        details.append({"asked_by": ["item", "product"], "say": f"The {old_text}; I'd like the {new_text} instead."})
        user = {"opening": "Hello, I need to exchange something I received.",
                "goal": f"Exchange the {old_text} of order {order_id} for the {new_text}.",
                "done_by": ["exchanged", "exchange has been", "exchange is requested", "exchange requested"],
                "fallback": "I'd like to exchange an item of an order."}
        items = [new if pid == old else pid for pid in order["items"]]
        expected["orders"][order_id] = {**order, "status": "exchange requested", "items": items}
        goal_fields.update(product_id=old, new_product_id=new, new_product_words=new_text)
    else:
        user = {"opening": "Hi, where is my parcel? It hasn't arrived yet.",
                "goal": f"Find out the status and the tracking number of order {order_id}.",
                "done_by": [order["tracking_number"].lower()], "fallback": "I'd like to know where my parcel is."}
        expected["must_say"] = [order["tracking_number"]]
    user.update(persona=f"{customers[me]['name']}, polite and brief", details=details)
    return {
        "responses_create_params": {"input": [{"role": "system", "content": POLICY}], "tools": TOOLS},
        "goal": goal_fields,
        "store": {"customers": customers, "orders": orders, "products": products},
        "user": user,
        "expected": expected,
    }


def make_dataset(size: int, seed: int = 0, split: str = "train", goals: Sequence[str] = GOALS) -> list[dict[str, Any]]:
    """``size`` rows of ``split`` (goals taking turns), the same for the same arguments."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {tuple(SPLITS)}, not {split!r}")
    if size < 0:
        raise ValueError(f"size must be >= 0, not {size}")
    if not goals or any(goal not in GOALS for goal in goals):
        raise ValueError(f"goals must be some of {GOALS}, not {list(goals)}")
    rng = random.Random(f"retail_support/{split}/{seed}")
    numbers = list(SPLITS[split])
    return [_row(goals[index % len(goals)], rng, rng.sample(numbers, 3)) for index in range(size)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=tuple(SPLITS), default="train")
    parser.add_argument("--out", default="-", help="a JSONL file, or - for standard output")
    args = parser.parse_args(argv)
    write_rows(make_dataset(args.size, args.seed, args.split), None if args.out == "-" else args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
