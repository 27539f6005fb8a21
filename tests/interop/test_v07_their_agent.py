"""Our servers, NeMo Gym 0.7.0's agent: its simple_agent and ``ng_collect_rollouts`` (from the 0.7
venv, one ``ng_run``) play our bundled example servers, started by our launcher, with 0.7's
openai_model in front of the scripted OpenAI-compatible model, and write the rewards our
servers give; and its gymnasium_agent plays our Gymnasium-protocol guess_number. 0.7's agent sends ``responses_create_params`` with the seven keys 0.4 did not
(``context_management``, ``conversation``, ...); our servers keep them and score."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import MODEL_INSTANCE, SHARED_SERVERS, _our_config, agent_name, our_player, our_rows
from .ng07 import ng07_python
from .ngstack import NgRun, read_jsonl
from .scripted_model import ScriptedModelServer, scripted_metadata

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(1800)]  # may build the 0.7 venv, then ng_run

NEW_KEYS = {"context_management", "conversation", "moderation", "prompt_cache_key", "prompt_cache_retention",
            "safety_identifier", "stream_options"}


GAME = "guess_number"
GAME_AGENT = "ours_guess_number_gymnasium_agent"
"""0.7's gymnasium_agent in front of our Gymnasium-protocol example server."""

TOY = "taxi"
TOY_AGENT = "ours_taxi_gymnasium_agent"
"""0.7's gymnasium_agent in front of Gymnasium's Taxi-v4, served by our bridge."""


@pytest.fixture(scope="module")
def stack(launched: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NgRun, Any]]:
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    python = ng07_python()
    workdir = tmp_path_factory.mktemp("ng07_run")
    servers = [*SHARED_SERVERS, GAME, TOY]
    rows = {server: our_rows(server) for server in servers}
    players = {server: our_player(server) for server in servers}
    with ScriptedModelServer(rows, players) as model, Launcher() as launcher:
        urls = {**{s: launched[s] for s in SHARED_SERVERS}, GAME: launcher.start(bundled_spec(GAME)).url,
                TOY: launcher.start(bundled_spec(TOY)).url}
        config, local = _our_config(urls, model.base_url)
        config = {name: block for name, block in config.items() if "vllm_model" not in yaml.safe_dump(block)
                  and not name.endswith("_chat_agent") and name not in (agent_name(GAME), agent_name(TOY))}
        config[GAME_AGENT] = {"responses_api_agents": {"gymnasium_agent": {
            "entrypoint": "app.py",
            "resources_server": {"type": "resources_servers", "name": f"ours_{GAME}"},
            "model_server": {"type": "responses_api_models", "name": MODEL_INSTANCE},
            "max_steps": 5,
        }}}
        config[TOY_AGENT] = {"responses_api_agents": {"gymnasium_agent": {
            "entrypoint": "app.py",
            "resources_server": {"type": "resources_servers", "name": f"ours_{TOY}"},
            "model_server": {"type": "responses_api_models", "name": MODEL_INSTANCE},
            "max_steps": 60,
        }}}
        run = NgRun(python, workdir, config, local)
        # 0.7 puts a generated "legacy_agent" environment server in front of each agent: it needs
        # a venv too (else ng_run calls uv), the same one.
        relay = workdir / "environment_servers" / "legacy_agent"
        relay.mkdir(parents=True, exist_ok=True)
        (relay / ".venv").symlink_to(run.venv, target_is_directory=True)
        try:
            run.start()
            yield run, model
        finally:
            run.stop()


@pytest.fixture(scope="module")
def rollouts(stack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run, model = stack
    folder = tmp_path_factory.mktemp("rollouts07")
    inputs = []
    for server in SHARED_SERVERS:
        for task_index, row in enumerate(our_rows(server)):
            for correct in (True, False):
                variant = copy.deepcopy(row)
                variant["responses_create_params"]["metadata"] = scripted_metadata(server, task_index, correct)
                variant["agent_ref"] = {"type": "responses_api_agents", "name": agent_name(server)}
                inputs.append(variant)
    for task_index, row in enumerate(our_rows(GAME)):  # right play only: this model sees no hints
        variant = copy.deepcopy(row)
        variant["responses_create_params"]["metadata"] = scripted_metadata(GAME, task_index, True)
        variant["agent_ref"] = {"type": "responses_api_agents", "name": GAME_AGENT}
        inputs.append(variant)
    for task_index, row in enumerate(our_rows(TOY)):  # the player reads the observations their agent relays
        variant = copy.deepcopy(row)
        variant["responses_create_params"]["metadata"] = scripted_metadata(TOY, task_index, True)
        variant["agent_ref"] = {"type": "responses_api_agents", "name": TOY_AGENT}
        inputs.append(variant)
    input_path, output_path = folder / "inputs.jsonl", folder / "rollouts.jsonl"
    input_path.write_text("".join(json.dumps(row) + "\n" for row in inputs))
    proc = run.run_cli("ng_collect_rollouts", f"+input_jsonl_fpath={input_path}",
                       f"+output_jsonl_fpath={output_path}", "+num_samples_in_parallel=4")
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n{run.log_tail()}"
    return {"inputs": inputs, "results": read_jsonl(output_path), "output": Path(output_path)}


def test_their_07_agent_gets_our_rewards(rollouts):
    results = [r for r in rollouts["results"] if r["agent_ref"]["name"] not in (GAME_AGENT, TOY_AGENT)]
    assert len(results) == sum(2 * len(our_rows(s)) for s in SHARED_SERVERS)
    for result in results:
        play = result["responses_create_params"]["metadata"]["scripted_play"]
        assert result["reward"] == (1.0 if play == "correct" else 0.0), {k: result.get(k) for k in
                                                                          ("reward", "failure_reason")}
        assert result.get("mask_sample") in (None, False)


def test_their_gymnasium_agent_plays_our_gymnasium_protocol_server(rollouts):
    """0.7's gymnasium_agent: /reset, /step with our session cookie, the step rewards summed."""
    results = [r for r in rollouts["results"] if r["agent_ref"]["name"] == GAME_AGENT]
    assert len(results) == len(our_rows(GAME))
    for result in results:
        assert (result["reward"], result["terminated"], result["truncated"]) == (1.0, True, False)
        assert result["info"]["result"] == "win"
        # their agent records the reset observation as a user message after the row's input
        assert result["responses_create_params"]["input"][-1]["content"].startswith("I am thinking of")


def test_their_gymnasium_agent_plays_gymnasiums_taxi_through_our_bridge(rollouts):
    """Their agent sums our step rewards; replaying its moves on the raw Taxi-v4 gives the same return."""
    import gymnasium

    from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.protocol.items import content_text

    fmt = GymnasiumEnvServer.from_config(bundled_spec(TOY).config, TOY).action_format
    results = [r for r in rollouts["results"] if r["agent_ref"]["name"] == TOY_AGENT]
    assert len(results) == len(our_rows(TOY))
    for result in results:
        moves = [fmt.parse(content_text(item["content"])) for item in result["response"]["output"]
                 if item.get("type") == "message" and item.get("role") == "assistant"]
        seed = our_rows(TOY)[int(result["responses_create_params"]["metadata"]["scripted_task"])]["seed"]
        raw = gymnasium.make("Taxi-v4")
        raw.reset(seed=seed)
        total = sum(float(raw.step(move)[1]) for move in moves)
        assert (result["reward"], result["terminated"]) == (total, True) and total > 0, seed


def test_their_07_agent_sends_the_new_create_keys_and_our_servers_keep_them(rollouts):
    for result in [r for r in rollouts["results"] if r["agent_ref"]["name"] not in (GAME_AGENT, TOY_AGENT)]:
        assert NEW_KEYS <= set(result["responses_create_params"]), sorted(result["responses_create_params"])
