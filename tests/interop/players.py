"""Scripted players for the interop tests: NeMo Gym's own example rows and the port fixture.

NeMo Gym's shipped ``data/example.jsonl`` rows differ from ours (other prompts; its
multi_step rows carry the expected values, its session rows the initial and expected counts,
its mcqa rows ``options`` and ``expected_answer``), so they get their own deterministic players. Each player is
``player(row, history, correct=True) -> list of Responses output items`` where ``history``
holds the ``function_call_output`` items the env returned so far; call ids are
``call_t<turn>_<index>`` so the player can tell which turn it is on.

``correct=True`` plays for reward 1.0, ``correct=False`` for 0.0 (where the verifier can
tell: NeMo Gym's example_single_tool_call gives 1.0 to every episode).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from nemo_gym_env.protocol.scripting import CALL_ID, assistant_message, field, function_call, turn_of

__all__ = ["PLAYERS", "Player", "call", "message", "play_episode", "tool_outputs", "turn_of"]

Player = Callable[..., list[dict[str, Any]]]

def tool_outputs(history: list[Any], turn: int) -> list[Any]:
    """The decoded outputs of turn ``turn``'s calls, in call order."""
    found = {}
    for item in history:
        match = CALL_ID.match(str(field(item, "call_id") or ""))
        if match and int(match.group(1)) == turn:
            found[int(match.group(2))] = json.loads(field(item, "output"))
    return [found[i] for i in sorted(found)]


call = function_call
"""A ``function_call`` item; a str ``arguments`` is sent as is (e.g. malformed JSON)."""


def message(turn: int, text: str) -> dict[str, Any]:
    """An assistant ``message`` item of turn ``turn``."""
    return assistant_message(text, f"msg_t{turn}")


def _last_user_text(row: dict[str, Any]) -> str:
    messages = row["responses_create_params"]["input"]
    if isinstance(messages, str):
        return messages
    users = [m for m in messages if field(m, "role") == "user"]
    content = field(users[-1], "content") if users else ""
    if isinstance(content, list):
        return " ".join(str(field(part, "text") or "") for part in content)
    return str(content)


# ---- NeMo Gym's example rows ------------------------------------------------------------


def single_tool_call(row: dict, history: list, *, correct: bool = True) -> list[dict]:
    """Their rows ask about a city loosely ("sf"): call get_weather, then answer; wrong play skips the tool."""
    turn = turn_of(history)
    if turn == 0:
        if correct:
            return [call(0, 0, "get_weather", {"city": "San Francisco"})]
        return [message(0, "Probably mild; take a jacket just in case.")]
    [reply] = tool_outputs(history, 0)
    return [message(turn, f"{reply['weather_description']} Dress warmly.")]


def multi_step(row: dict, history: list, *, correct: bool = True) -> list[dict]:
    """Look up every expected synonym, then submit the values in order (reversed when wrong)."""
    turn = turn_of(history)
    synonyms = row["expected_synonyms"]
    if turn == 0:
        return [call(0, i, "get_synonym_value", {"synonym": s}) for i, s in enumerate(synonyms)]
    if turn == 1:
        values = [reply["synonym_value"] for reply in tool_outputs(history, 0)]
        if not correct:
            values = values[::-1] if values[::-1] != values else [values[0] + 1, *values[1:]]
        return [call(1, 0, "extract_synonym_values", {"synonym_values": values})]
    return [message(turn, "Submitted the synonym values.")]


def session_state_mgmt(row: dict, history: list, *, correct: bool = True) -> list[dict]:
    """Their rows say "add 1 then add 2 then get the count": increment, read, answer."""
    turn = turn_of(history)
    if turn == 0:
        steps = [int(x) for x in re.findall(r"-?\d+", _last_user_text(row))]
        assert sum(steps) == row["expected_count"] - row["initial_count"], row
        if not correct:
            steps[-1] += 1
        return [call(0, i, "increment_counter", {"count": n}) for i, n in enumerate(steps)]
    if turn == 1:
        return [call(1, 0, "get_counter_value", {})]
    [reply] = tool_outputs(history, 1)
    return [message(turn, f"The count is {reply['count']}.")]


def mcqa(row: dict, history: list, *, correct: bool = True) -> list[dict]:
    """Answer in one message, in the form the row is graded by; wrong play names another letter.

    ``template_metadata.output_regex`` rows get ``Answer: \\boxed{X}``, ``lenient_answer_colon``
    rows ``Answer: X``, the rest ``\\boxed{X}`` (NeMo Gym's default strict mode).
    """
    options = row["options"]
    letters = list(options) if isinstance(options, dict) else [letter for option in options for letter in option]
    answer = row["expected_answer"]
    if not correct:
        answer = next(letter for letter in letters if letter != answer)
    if (row.get("template_metadata") or {}).get("output_regex"):
        final = f"Answer: \\boxed{{{answer}}}"
    elif row.get("grading_mode") == "lenient_answer_colon":
        final = f"Answer: {answer}"
    else:
        final = f"\\boxed{{{answer}}}"
    return [message(0, f"Weighing the options, the best one is {answer}.\n{final}")]


# ---- the port fixture (tests/fixtures/servers/ng_style_server) ---------------------------


def shopping_cart(row: dict, history: list, *, correct: bool = True) -> list[dict]:
    """Remove what is not wanted, add what is missing, check the cart, answer.

    Wrong play leaves out the last change, so the cart ends wrong.
    """
    turn = turn_of(history)
    if turn == 0:
        have, want = Counter(row.get("initial_items", [])), Counter(row["expected_items"])
        changes = [("remove_item", item) for item in (have - want).elements()]
        changes += [("add_item", item) for item in (want - have).elements()]
        if not correct:
            changes = changes[:-1]
        return [call(0, i, name, {"item": item}) for i, (name, item) in enumerate(changes)] or [
            call(0, 0, "view_cart", {})
        ]
    if turn == 1:
        return [call(1, 0, "view_cart", {})]
    [reply] = tool_outputs(history, 1)
    return [message(turn, "Your cart: " + ", ".join(reply["items"]))]


PLAYERS: dict[str, Player] = {
    "example_single_tool_call": single_tool_call,
    "example_multi_step": multi_step,
    "example_session_state_mgmt": session_state_mgmt,
    "mcqa": mcqa,
    "ng_style_server": shopping_cart,
}
"""Player of each NeMo Gym server (and of the port fixture), for NeMo Gym's rows."""


def play_episode(env: Any, player: Player, *, correct: bool = True, max_turns: int = 10,
                 **reset_kwargs: Any) -> dict[str, Any]:
    """Play one episode; returns reward, flags, info, the verify reply and every observation."""
    obs, info = env.reset(**reset_kwargs)
    row = env.unwrapped.task
    history: list[dict] = []
    for _ in range(max_turns):
        obs, reward, terminated, truncated, info = env.step(player(row, history, correct=correct))
        history.extend(obs)
        if terminated or truncated:
            return {
                "reward": reward,
                "terminated": terminated,
                "truncated": truncated,
                "info": info,
                "verify": env.unwrapped.last_verify,
                "observations": [item["output"] for item in history],
            }
    raise AssertionError(f"episode did not end in {max_turns} turns")
