"""Helpers for tests of resources servers and parsers (the project's own servers and users' alike).

A server's tests run it in process, through FastAPI's ``TestClient`` (no socket, no
subprocess), and drive it as the env would: seed a session, call the tools the scripted
player asks for with the session's cookie, and verify the episode::

    from pathlib import Path

    from nemo_gym_env.server.testing import app_client, assistant_message, example_rows, play, verify
    from my_server.app import MyServer
    from my_server.scripted import scripted_action

    ROWS = example_rows(Path(__file__).parent.parent)          # the server folder

    def test_scripted_play():
        with app_client(MyServer, {"timeout_s": 2}, name="my_server") as client:
            assert play(client, ROWS[0], scripted_action, correct=True)["reward"] == 1.0
            assert verify(client, ROWS[0], [assistant_message("no idea")])["reward"] == 0.0

- :func:`example_rows`, :func:`server_config`: a server folder's ``data/example.jsonl`` and the
  instance block of its ``configs/<name>.yaml``;
- :func:`app_client`: a ``TestClient`` of a server class (or object) and its config;
- :func:`assistant_message`, :func:`function_call`, :func:`reasoning`: the items a model turn
  holds (from :mod:`~nemo_gym_env.protocol.scripting`);
- :func:`verify`: ``POST /verify`` with a row and the episode's items;
- :func:`play`: one scripted episode against the tool routes, verified;
- :func:`play_steps`: one scripted episode of a Gymnasium-protocol server (``/reset``, ``/step``);
- :func:`play_episode`: one scripted episode on a Gymnasium env of the server;
- :func:`times_slower_than_plain`: whether a parser stays linear on adversarial text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from nemo_gym_env.protocol.scripting import assistant_message, function_call, play_turn, reasoning
from nemo_gym_env.protocol.types import make_response

__all__ = [
    "ScriptedAction",
    "app_client",
    "assistant_message",
    "example_rows",
    "function_call",
    "play",
    "play_episode",
    "play_steps",
    "reasoning",
    "server_config",
    "times_slower_than_plain",
    "verify",
]

ScriptedAction = Callable[..., list[dict[str, Any]]]
"""A scripted player: ``scripted_action(row, history, correct=True) -> items of one model turn``."""

_JSON = {"content-type": "application/json"}


def example_rows(server_dir: Path | str, dataset: str = "data/example.jsonl") -> list[dict[str, Any]]:
    """The task rows of a server folder's ``data/example.jsonl`` (blank lines skipped).

    Example:
        >>> from nemo_gym_env.launch.catalog import bundled_servers
        >>> len(example_rows(bundled_servers()["example_single_tool_call"]))
        5
    """
    path = Path(server_dir) / dataset
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def server_config(server_dir: Path | str, name: str) -> dict[str, Any]:
    """The block of instance ``name`` in a server folder's ``configs/<name>.yaml`` (NeMo Gym's format).

    Asserts the file defines ``name: resources_servers: name:`` (instance and implementation
    both named after the folder's server) and that its entrypoint is a file of the folder.

    Example:
        >>> from nemo_gym_env.launch.catalog import bundled_servers
        >>> server_config(bundled_servers()["math"], "math")["entrypoint"]
        'app.py'
    """
    folder = Path(server_dir)
    path = folder / "configs" / f"{name}.yaml"
    config = yaml.safe_load(path.read_text())
    block = config.get(name) if isinstance(config, dict) else None
    block = block.get("resources_servers") if isinstance(block, dict) else None
    block = block.get(name) if isinstance(block, dict) else None
    assert isinstance(block, dict), f"{path} does not define {name}: resources_servers: {name}: ..."
    entrypoint = block.get("entrypoint")
    assert isinstance(entrypoint, str) and (folder / entrypoint).is_file(), f"{path}: no file {entrypoint!r}"
    return block


def app_client(server: Any, config: dict[str, Any] | None = None, *, name: str | None = None,
               **client_kwargs: Any) -> TestClient:
    """A ``TestClient`` of a server's app: ``TestClient(Server.from_config(config, name=name).build_app())``.

    ``server`` is a server class (built from ``config``, under instance ``name``: required),
    or a server object already built (then give neither). Use it as a context manager, so
    the app's start-up and shutdown run (worker pools, sandboxes): ``with app_client(...) as
    client:``. ``client_kwargs`` go to ``TestClient`` (``cookies``, ``raise_server_exceptions``).
    """
    if isinstance(server, type):
        if name is None:
            raise TypeError("app_client(ServerClass, config, name=...): a class needs its instance name")
        server = server.from_config(config or {}, name=name)
    elif config is not None or name is not None:
        raise TypeError("app_client(server_object): the object is already built; give no config or name")
    return TestClient(server.build_app(), **client_kwargs)


def verify(client: TestClient, row: dict[str, Any], output: list[Any]) -> dict[str, Any]:
    """``POST /verify`` with ``row`` and a ``Response`` holding ``output`` (and the row's tools).

    Asserts the reply is a 200 and returns its JSON (the row echoed back, ``reward``, metrics).
    """
    params = row.get("responses_create_params")
    tools = params.get("tools") if isinstance(params, dict) else None
    response = make_response(output, tools=tools)
    reply = client.post("/verify", json={**row, "response": response.model_dump(mode="json")})
    assert reply.status_code == 200, reply.text
    return reply.json()


def play(client: TestClient, row: dict[str, Any], scripted_action: ScriptedAction, *, correct: bool = True,
         max_turns: int = 10) -> dict[str, Any]:
    """Seed a session with ``row``, play ``scripted_action`` to the end against the tool routes, verify.

    Each turn's ``function_call`` items go to ``POST /<name>`` with their arguments exactly as
    written, in the session of the client's cookie; each reply must be a 200 and its body is
    the ``function_call_output`` the player sees next. The episode ends at the first turn with
    no call (an ``AssertionError`` if ``max_turns`` go by first); returns :func:`verify`'s JSON
    for every item of the episode.
    """
    seeded = client.post("/seed_session", json=row)
    assert seeded.status_code == 200, seeded.text
    history: list[dict[str, Any]] = []
    output: list[dict[str, Any]] = []
    for _ in range(max_turns):
        items = scripted_action(row, history, correct=correct)
        output.extend(items)
        calls = [item for item in items if item["type"] == "function_call"]
        if not calls:
            return verify(client, row, output)
        for call in calls:
            reply = client.post(f"/{call['name']}", content=call["arguments"], headers=_JSON)
            assert reply.status_code == 200, f"POST /{call['name']}: {reply.status_code} {reply.text}"
            result = {"type": "function_call_output", "call_id": call["call_id"], "output": reply.text}
            history.append(result)
            output.append(result)
    raise AssertionError(f"the scripted player did not finish in {max_turns} turns")


def play_steps(client: TestClient, row: dict[str, Any], scripted_action: ScriptedAction, *,
               correct: bool = True, max_turns: int = 50) -> tuple[list[float], dict[str, Any]]:
    """One scripted episode of a Gymnasium-protocol server: ``POST /reset``, then ``POST /step`` to the end.

    Each turn's items go to ``/step`` as a ``Response`` with the row, in the session of the
    client's cookie; the player sees the server's observations as user messages (and
    ``info["tool_outputs"]`` as ``function_call_output`` items), as the env shows them. Every
    reply must be a 200. Returns every step's reward and the last ``/step`` reply; an
    ``AssertionError`` when ``max_turns`` steps do not end the episode.
    """
    reset = client.post("/reset", json=row)
    assert reset.status_code == 200, reset.text
    params = row.get("responses_create_params")
    tools = params.get("tools") if isinstance(params, dict) else None
    history: list[dict[str, Any]] = []
    first = reset.json().get("observation")
    shown = [{"type": "message", "role": "user", "content": first}] if first else []
    rewards: list[float] = []
    for _ in range(max_turns):
        items = play_turn(scripted_action, row, shown, history, correct=correct)
        response = make_response(items, tools=tools).model_dump(mode="json")
        reply = client.post("/step", json={**row, "response": response})
        assert reply.status_code == 200, reply.text
        step = reply.json()
        rewards.append(step["reward"])
        if step["terminated"] or step["truncated"]:
            return rewards, step
        for out in step["info"].get("tool_outputs") or []:
            history.append({"type": "function_call_output", "call_id": out["call_id"], "output": out["output"]})
        if step["observation"]:
            history.append({"type": "message", "role": "user", "content": step["observation"]})
    raise AssertionError(f"the scripted player did not finish in {max_turns} turns")


def play_episode(env: Any, scripted_action: ScriptedAction, *, correct: bool = True, max_turns: int = 50,
                 **reset_kwargs: Any) -> tuple[float, bool, bool, dict[str, Any]]:
    """One scripted episode on a Gymnasium env of the server (``gym.make("NemoGym/<server>-v0")``).

    ``reset(**reset_kwargs)``, then ``step`` with the player's turns (given the observations
    so far) until the episode ends; returns the last ``(reward, terminated, truncated, info)``.
    Raises ``AssertionError`` when ``max_turns`` steps do not end it.
    """
    shown, _ = env.reset(**reset_kwargs)
    row = env.unwrapped.task
    history: list[Any] = []
    for _ in range(max_turns):
        action = play_turn(scripted_action, row, shown, history, correct=correct)
        observation, reward, terminated, truncated, info = env.step(action)
        history.extend(observation)
        if terminated or truncated:
            return reward, terminated, truncated, info
    raise AssertionError(f"the episode did not end in {max_turns} turns")


def times_slower_than_plain(read: Callable[[str], object], text: str, repeats: int = 3) -> float:
    """How many times longer ``read(text)`` takes than ``read`` of plain text of the same length.

    Both are timed side by side, best of ``repeats`` each, in the CPU time of the calling thread
    (not wall time, which other processes' load stretches: a loaded machine tripled a 20 ms read
    while the plain one stayed under the floor), so the figure holds on a busy machine. A reader
    that is linear on ``text`` gives about 1 (a few at most); one that backtracks quadratically
    on 100k characters gives thousands. Times under a millisecond count as a millisecond.

    Example:
        >>> times_slower_than_plain(len, "{" * 100_000) < 50
        True
    """
    plain = "x" * len(text)

    def best(arg: str) -> float:
        fastest = float("inf")
        for _ in range(repeats):
            started = time.thread_time()
            read(arg)
            fastest = min(fastest, time.thread_time() - started)
        return max(fastest, 1e-3)

    return best(text) / best(plain)
