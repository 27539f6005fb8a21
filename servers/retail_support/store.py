"""The store of ``retail_support``: its data (customers, orders, products), the agent's tools on it, the policy.

A task row carries its own small store (``store``); the server plays each episode on a copy, so
episodes never see each other's changes. The tools enforce the store's rules (only a pending
order can be cancelled, only a delivered one exchanged, and only for an in-stock variant of the
same product at the same price, and nothing is touched before the customer is identified); the
rest of the policy (ask before acting, refund only when asked) is the agent's to follow, and the
reward finds out whether it did (the end state must be the goal's).

Example:
    >>> store = Store.model_validate(EXAMPLE)
    >>> state = Session(store)
    >>> run_tool(state, "find_customer_by_email", {"email": "ana.silva.1001@example.com"})["orders"]
    ['#W1001001']
    >>> run_tool(state, "cancel_order", {"order_id": "#W1001001"})["status"]
    'cancelled'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym_env.conversation import ToolError

__all__ = ["EXAMPLE", "POLICY", "TOOLS", "Customer", "Order", "Product", "Session", "Store", "run_tool"]

Status = Literal["pending", "shipped", "delivered", "cancelled", "exchange requested", "refunded"]


class Product(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=100)
    variant: str = Field(max_length=100)
    price: float = Field(ge=0, le=1_000_000)
    in_stock: bool


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")

    customer_id: str = Field(max_length=40)
    status: Status
    items: list[str] = Field(min_length=1, max_length=20)
    tracking_number: str | None = Field(default=None, max_length=40)


class Customer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=100)
    email: str = Field(max_length=200)
    orders: list[str] = Field(max_length=50)


class Store(BaseModel):
    """A row's ``store``: bounded, so a hostile row cannot make a session hold megabytes."""

    model_config = ConfigDict(extra="forbid")

    customers: dict[str, Customer] = Field(max_length=200)
    orders: dict[str, Order] = Field(max_length=1000)
    products: dict[str, Product] = Field(max_length=200)


@dataclass
class Session:
    """One episode's copy of the store and who the agent has identified."""

    store: Store
    identified: set[str] = field(default_factory=set)


def _order(session: Session, arguments: dict[str, Any]) -> tuple[str, Order]:
    order_id = _text(arguments, "order_id")
    order = session.store.orders.get(order_id)
    if order is None:
        raise ToolError(f"no order {order_id!r}")
    if order.customer_id not in session.identified:
        raise ToolError("identify the customer first (find_customer_by_email with the email on their account)")
    return order_id, order


def _text(arguments: dict[str, Any], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{name} must be a non-empty string")
    return value.strip()[:200]


def _order_view(order_id: str, order: Order, store: Store) -> dict[str, Any]:
    items = [{"product_id": pid, **store.products[pid].model_dump(exclude={"in_stock"})} if pid in store.products
             else {"product_id": pid} for pid in order.items]
    return {"order_id": order_id, "status": order.status, "items": items, "tracking_number": order.tracking_number}


def find_customer_by_email(session: Session, arguments: dict[str, Any]) -> Any:
    email = _text(arguments, "email").lower()
    for customer_id, customer in session.store.customers.items():
        if customer.email.lower() == email:
            session.identified.add(customer_id)
            return {"customer_id": customer_id, "name": customer.name, "orders": list(customer.orders)}
    raise ToolError(f"no customer has the email {email!r}")


def get_order(session: Session, arguments: dict[str, Any]) -> Any:
    order_id, order = _order(session, arguments)
    return _order_view(order_id, order, session.store)


def find_product(session: Session, arguments: dict[str, Any]) -> Any:
    words = _text(arguments, "name").lower().split()
    found = [{"product_id": pid, **product.model_dump()} for pid, product in session.store.products.items()
             if all(word in f"{product.name} {product.variant}".lower() for word in words)]
    return {"products": found[:20]}


def _move(session: Session, arguments: dict[str, Any], before: str, after: Status) -> Any:
    """Move an order from status ``before`` to ``after`` (refused from any other status)."""
    order_id, order = _order(session, arguments)
    if order.status != before:
        raise ToolError(f"order {order_id} is {order.status}: only a {before} order can be {after}")
    order.status = after
    return _order_view(order_id, order, session.store)


def cancel_order(session: Session, arguments: dict[str, Any]) -> Any:
    return _move(session, arguments, "pending", "cancelled")


def exchange_item(session: Session, arguments: dict[str, Any]) -> Any:
    order_id, order = _order(session, arguments)
    old, new = _text(arguments, "product_id"), _text(arguments, "new_product_id")
    if order.status != "delivered":
        raise ToolError(f"order {order_id} is {order.status}: only a delivered order can have an item exchanged")
    if old not in order.items:
        raise ToolError(f"order {order_id} holds no {old!r}")
    products = session.store.products
    if new not in products:
        raise ToolError(f"no product {new!r}")
    if products[new].name != products[old].name or products[new].price != products[old].price or new == old:
        raise ToolError(f"{new} is not another variant of {products[old].name} at the same price")
    if not products[new].in_stock:
        raise ToolError(f"{new} is out of stock")
    order.items[order.items.index(old)] = new
    order.status = "exchange requested"
    return _order_view(order_id, order, session.store)


def refund_order(session: Session, arguments: dict[str, Any]) -> Any:
    return _move(session, arguments, "delivered", "refunded")


_TOOLS = {fn.__name__: fn for fn in (find_customer_by_email, get_order, find_product, cancel_order, exchange_item,
                                     refund_order)}


def run_tool(session: Session, name: str, arguments: dict[str, Any]) -> Any:
    """Run tool ``name``; :class:`ToolError` for an unknown tool or a call the store refuses."""
    tool = _TOOLS.get(name)
    if tool is None:
        raise ToolError(f"unknown tool {name[:60]!r}; the tools are: {', '.join(_TOOLS)}")
    return tool(session, arguments)


def _schema(tool: str, description: str, **params: str) -> dict[str, Any]:
    return {"type": "function", "name": tool, "description": description, "strict": True,
            "parameters": {"type": "object", "additionalProperties": False, "required": list(params),
                           "properties": {key: {"type": "string", "description": text} for key, text in params.items()}}}


TOOLS = [
    _schema("find_customer_by_email", "Find a customer by the email on their account: their id, name and orders.",
            email="The email, e.g. 'ana.silva.1001@example.com'."),
    _schema("get_order", "Read an order: its status, items (product id, name, variant, price) and tracking number.",
            order_id="The order id, e.g. '#W1001001'."),
    _schema("find_product", "Find products whose name and variant hold all the given words.",
            name="Words of the product's name or variant, e.g. 'mug red'."),
    _schema("cancel_order", "Cancel a pending order.", order_id="The order id."),
    _schema("exchange_item", "Exchange an item of a delivered order for another variant of the same product.",
            order_id="The order id.", product_id="The product id of the item to exchange.",
            new_product_id="The product id of the variant the customer wants instead."),
    _schema("refund_order", "Refund a delivered order.", order_id="The order id."),
]
"""The agent's tools, as Responses ``function`` tools (every row offers these)."""

POLICY = """You are the support agent of Northwind Goods, an online store. Help the customer with their request, following this policy:
1. First identify the customer: ask for the email on their account and look it up with find_customer_by_email.
2. Read an order with get_order before you talk about it or change it.
3. Only a pending order can be cancelled (cancel_order). Only a delivered order can have an item exchanged (exchange_item), for another variant of the same product that is in stock; find_product finds variants.
4. Before you cancel or exchange, say what you will do and ask the customer to confirm. Act only after they say yes.
5. Refund an order (refund_order) only when the customer asks for a refund.
6. To ask or tell the customer something, write plain text without a tool call. Call one tool at a time."""
"""The agent's system prompt in every row."""

EXAMPLE = {
    "customers": {"C1001": {"name": "Ana Silva", "email": "ana.silva.1001@example.com", "orders": ["#W1001001"]}},
    "orders": {"#W1001001": {"customer_id": "C1001", "status": "pending", "items": ["P01"], "tracking_number": None}},
    "products": {"P01": {"name": "Mug", "variant": "blue", "price": 12.0, "in_stock": True}},
}
"""A store of one customer, one order, one product (the docstring's example)."""
