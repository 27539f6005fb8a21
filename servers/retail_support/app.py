"""``retail_support``: an online store's support agent, with tools over a small database and a customer who talks back.

Each task row holds a small store (customers, orders, products: :mod:`.store`), the customer's
hidden goal (``goal``: cancel an order, exchange an item, or ask where a parcel is) and the
customer as a :class:`~nemo_gym_env.conversation.UserSpec`: an opening request and the details
(their email, the order number, the item) that they give only when the agent asks. The agent's
system prompt is the store's policy (:data:`~.store.POLICY`); its tools read and change the
store. A turn without a tool call goes to the customer, whose answer is the next observation;
the customer ends the conversation when their request is done, and the episode is scored:

==============  ============================================================================
component       1.0 when
==============  ============================================================================
``state``       the store's end state is the goal's: the goal's order changed as asked and
                nothing else changed (a wrong action, or none, scores 0)
``informed``    every fact the customer asked for (``must_say``: a parcel's status and tracking
                number) is in something the agent told them (1.0 when they asked for none)
==============  ============================================================================

The reward is their product. Rows: ``make_dataset`` (train and held-out rows never share a
customer); the customer is scripted by default, or a model (``user: policy`` in the YAML,
docs/conversations.md). A Gymnasium env of it: ``gym.make("NemoGym/retail_support-v0")``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym_env.conversation import ConversationServer, Talk
from nemo_gym_env.servers.retail_support.store import Order, Session, Store, run_tool

__all__ = ["Expected", "RetailSupportServer"]


class Expected(BaseModel):
    """A row's ``expected``: the orders the goal changes, as they must end (every other record unchanged)."""

    model_config = ConfigDict(extra="forbid")

    orders: dict[str, Order] = Field(default_factory=dict, max_length=20)
    must_say: list[str] = Field(default_factory=list, max_length=10)


class RetailSupportServer(ConversationServer):
    """The ``retail_support`` server; see the module docstring."""

    def start(self, row: dict[str, Any]) -> Session:
        Expected.model_validate(row.get("expected") or {})  # a row that could never be scored is refused now
        return Session(Store.model_validate(row.get("store")))

    def call_tool(self, state: Session, name: str, arguments: dict[str, Any]) -> Any:
        return run_tool(state, name, arguments)

    def score(self, state: Session, row: dict[str, Any], talk: Talk) -> dict[str, float]:
        expected = Expected.model_validate(row.get("expected") or {})
        goal = Store.model_validate(row["store"])
        goal.orders.update(expected.orders)
        told = " ".join(line["text"] for line in talk.said if line["role"] == "agent").lower()
        informed = all(fact.lower() in told for fact in expected.must_say)
        return {"state": float(state.store == goal), "informed": float(informed)}


if __name__ == "__main__":
    RetailSupportServer.run_webserver()
