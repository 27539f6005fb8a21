"""Scripted player for ``blackjack``: hits below 17 and sticks from 17 on, as the dealer does.

With ``correct=False`` it always hits (until it goes over 21). Reads its total from the observation.

Example:
    >>> scripted_action({}, [], observations=["Your cards total 12. The dealer shows 10."])[0]["content"][0]["text"]
    '<action>hit</action>'
"""

from __future__ import annotations

import re
from typing import Any

from nemo_gym_env.protocol.scripting import assistant_message

__all__ = ["scripted_action"]

_TOTAL = re.compile(r"Your cards total (\d+)")


def scripted_action(row: dict[str, Any], history: list[Any], *, correct: bool = True,
                    observations: list[str] = ()) -> list[dict[str, Any]]:
    """Hit or stick, from the latest observation."""
    found = _TOTAL.findall(observations[-1] if observations else "")
    total = int(found[-1]) if found else 0
    move = "hit" if (not correct or total < 17) else "stick"
    return [assistant_message(f"<action>{move}</action>", f"msg_t{len(observations)}")]
