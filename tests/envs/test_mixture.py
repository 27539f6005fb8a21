"""Mixtures: the weights' arithmetic, bad input at make time, and the mixture vector env on real servers."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import nemo_gym_env  # noqa: F401
from nemo_gym_env.envs.mixture import ENVIRONMENT_KEY, apportion, assign, mixture_entries, mixture_rows
from nemo_gym_env.envs.mixture_vector import NemoGymMixtureVectorEnv
from nemo_gym_env.errors import ActionError, ConfigError, NemoGymError

from ..conftest import example_rows, scripted

MIXTURE = "NemoGym/Mixture-v0"
SINGLE, MULTI = "example_single_tool_call", "example_multi_step"


def _mixture(launched, num_envs, weights=(1.0, 1.0), **kwargs):
    envs = {f"NemoGym/{SINGLE}-v0": {"weight": weights[0], "base_url": launched[SINGLE]},
            f"NemoGym/{MULTI}-v0": {"weight": weights[1], "base_url": launched[MULTI]}}
    return gym.make_vec(MIXTURE, num_envs=num_envs, envs=envs, **kwargs)


def _server(env_id: str) -> str:
    return env_id.split("/")[1].rsplit("-v", 1)[0]


def _actions(envs, histories, obs):
    """Each live sub-env's scripted action, by the server its environment runs."""
    actions = []
    for i, episode in enumerate(envs.episodes):
        if not envs.live_mask[i]:
            actions.append(None)
            continue
        histories[i].extend(o for o in obs[i] if o.get("type") == "function_call_output")
        actions.append(scripted(_server(envs.env_ids[i]))(episode.task, histories[i]))
    return actions


# ---- the arithmetic ----------------------------------------------------------------------------


def test_apportion_gives_exact_shares_and_at_least_one_each():
    assert apportion([0.5, 0.5], 256) == [128, 128]
    assert apportion([3, 1], 10) == [8, 2]  # 7.5 / 2.5: the tie goes to the first
    assert apportion([1, 1, 1], 10) == [4, 3, 3]
    assert apportion([0.98, 0.01, 0.01], 3) == [1, 1, 1]
    assert apportion([1000, 1], 5) == [4, 1]
    for total in range(3, 40):
        counts = apportion([0.7, 0.2, 0.1], total)
        assert sum(counts) == total and min(counts) >= 1


def test_assignment_is_deterministic_per_seed_and_keeps_the_counts():
    entries = mixture_entries({"NemoGym/math-v0": 0.75, "NemoGym/mcqa-v0": 0.25})
    a, b, c = assign(entries, 16, 0), assign(entries, 16, 0), assign(entries, 16, 1)
    assert a == b and a != c
    assert a.count("NemoGym/math-v0") == c.count("NemoGym/math-v0") == 12
    assert assign(entries, 4, None) == ["NemoGym/math-v0"] * 3 + ["NemoGym/mcqa-v0"]


@pytest.mark.parametrize(("envs", "num_envs", "match"), [
    ({"NemoGym/math-v0": -0.5, "NemoGym/mcqa-v0": 1.0}, 4, "must be >= 0"),
    ({"NemoGym/math-v0": 0, "NemoGym/mcqa-v0": 0.0}, 4, "sum to 0"),
    ({"NemoGym/nope-v0": 1.0}, 4, "unknown env id 'NemoGym/nope-v0'"),
    ({"CartPole-v1": 1.0}, 4, "unknown env id"),
    ({"NemoGym/math-v0": 1, "NemoGym/mcqa-v0": 1, "NemoGym/code_gen-v0": 1}, 2, "cannot give each of the 3"),
    ({"NemoGym/math-v0": float("nan")}, 4, "finite number"),
    ({"NemoGym/math-v0": "0.5"}, 4, "finite number"),
    ({"NemoGym/math-v0": {"base_url": "http://127.0.0.1:1"}}, 4, "needs a 'weight'"),
    ({"NemoGym/math-v0": {"weight": 1, "bogus": 1}}, 4, "unknown entry keys"),
    ({"NemoGym/Generic-v0": 1.0}, 4, "needs"),
    ({}, 4, "non-empty"),
    ({"NemoGym/math-v0": 1.0}, 0, "num_envs must be an int >= 1"),
])
def test_bad_mixtures_are_refused_at_make_time(envs, num_envs, match):
    with pytest.raises(ConfigError, match=match) as caught:
        gym.make_vec(MIXTURE, num_envs=num_envs, envs=envs)
    assert isinstance(caught.value, NemoGymError)


def test_missing_envs_and_unknown_arguments_are_refused_by_both_forms():
    with pytest.raises(ConfigError, match="needs envs="):
        gym.make_vec(MIXTURE, num_envs=2)
    with pytest.raises(ConfigError, match="unknown arguments"):
        gym.make_vec(MIXTURE, num_envs=2, envs={"NemoGym/math-v0": 1}, base_url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="needs envs="):
        gym.make(MIXTURE)
    with pytest.raises(ConfigError, match="unknown arguments"):
        gym.make(MIXTURE, envs={"NemoGym/math-v0": 1}, base_url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="unknown env id"):
        gym.make(MIXTURE, envs={"NemoGym/nope-v0": 1})


# ---- the single env, on real servers -------------------------------------------------------------


@pytest.mark.slow
def test_gym_make_draws_its_environment_by_weight_at_each_reset(launched):
    """One env over two real servers: each reset draws an environment (seeded), plays it to its reward."""
    envs = {f"NemoGym/{SINGLE}-v0": {"weight": 3, "base_url": launched[SINGLE]},
            f"NemoGym/{MULTI}-v0": {"weight": 1, "base_url": launched[MULTI]}}
    env = gym.make(MIXTURE, envs=envs)
    try:
        drawn = []
        for seed in range(40):
            obs, info = env.reset(seed=seed)
            env_id = info["env_id"]
            drawn.append(env_id)
            assert env.unwrapped.env_id == env_id
            history: list = []
            play = scripted(_server(env_id))
            terminated = truncated = False
            while not (terminated or truncated):
                obs, reward, terminated, truncated, info = env.step(play(env.unwrapped.task, history))
                history.extend(o for o in obs if o.get("type") == "function_call_output")
                assert info["env_id"] == env_id
            assert terminated and reward == 1.0, (seed, env_id, info)
        # Both environments are played, in about the weights' proportion (3:1 over 40 draws).
        assert 20 <= drawn.count(f"NemoGym/{SINGLE}-v0") <= 38 and f"NemoGym/{MULTI}-v0" in drawn
        # Same seed, same environment and same task; options["env_id"] picks one.
        _, first = env.reset(seed=7)
        task = env.unwrapped.task
        _, again = env.reset(seed=7)
        assert again["env_id"] == first["env_id"] and env.unwrapped.task == task
        _, picked = env.reset(seed=7, options={"env_id": f"NemoGym/{MULTI}-v0", "task_index": 1})
        assert picked["env_id"] == f"NemoGym/{MULTI}-v0" and picked["task_index"] == 1
        with pytest.raises(ValueError, match="none of"):
            env.reset(options={"env_id": "NemoGym/math-v0"})
        tools = set(env.action_space.tool_names)
        assert {"get_weather", "get_synonym_value"} <= tools
    finally:
        env.close()


def test_a_zero_weight_environment_is_left_out():
    entries = mixture_entries({"NemoGym/math-v0": 1.0, "NemoGym/mcqa-v0": 0})
    assert [e.env_id for e in entries] == ["NemoGym/math-v0"]


# ---- the task list -------------------------------------------------------------------------------


def test_mixture_rows_follow_the_weights_and_name_their_server():
    rows = mixture_rows({"NemoGym/math-v0": 0.75, "NemoGym/mcqa-v0": 0.25}, 12, seed=3)
    assert rows == mixture_rows({"NemoGym/math-v0": 0.75, "NemoGym/mcqa-v0": 0.25}, 12, seed=3)
    names = [r["agent_ref"]["name"] for r in rows]
    assert names.count("math") == 9 and names.count("mcqa") == 3
    assert all(r[ENVIRONMENT_KEY] == f"NemoGym/{r['agent_ref']['name']}-v0" for r in rows)
    math_rows = [{k: v for k, v in r.items() if k not in ("agent_ref", ENVIRONMENT_KEY)}
                 for r in rows if r["agent_ref"]["name"] == "math"]
    originals = example_rows("math")
    assert all(r in originals for r in math_rows)
    # 9 draws from 5 rows: every row once before any row twice.
    counts = [sum(r == o for r in math_rows) for o in originals]
    assert sorted(counts) == [1, 2, 2, 2, 2]
    assert len(mixture_rows({"NemoGym/math-v0": 1, "NemoGym/mcqa-v0": 1})) == 10  # default: all rows


def test_mixture_rows_take_a_given_dataset_and_refuse_bad_counts():
    own = example_rows(SINGLE)[:2]
    rows = mixture_rows({f"NemoGym/{SINGLE}-v0": {"weight": 1, "dataset": own}}, 4)
    assert [{k: v for k, v in r.items() if k not in ("agent_ref", ENVIRONMENT_KEY)} for r in rows].count(own[0]) == 2
    with pytest.raises(ConfigError, match="num_rows"):
        mixture_rows({"NemoGym/math-v0": 1}, 0)
    with pytest.raises(ConfigError, match="cannot give each"):
        mixture_rows({"NemoGym/math-v0": 1, "NemoGym/mcqa-v0": 1}, 1)


# ---- the vector env, on real servers -------------------------------------------------------------


@pytest.mark.slow
def test_make_vec_starts_each_environments_server_and_names_it_in_infos():
    """The issue's call, on the bundled math and mcqa servers (started here), each sub-env answered."""
    envs = gym.make_vec(MIXTURE, num_envs=6, envs={"NemoGym/math-v0": 0.5, "NemoGym/mcqa-v0": 0.5})
    try:
        assert isinstance(envs, NemoGymMixtureVectorEnv)
        assert sorted(envs.env_ids) == ["NemoGym/math-v0"] * 3 + ["NemoGym/mcqa-v0"] * 3
        obs, infos = envs.reset(seed=0)
        assert infos["env_id"].tolist() == list(envs.env_ids)
        for i, env_id in enumerate(envs.env_ids):  # each sub-env's task is one of its environment's rows
            assert envs.episodes[i].task in example_rows(_server(env_id))
        actions = [scripted(_server(e))(envs.episodes[i].task, [], correct=True) for i, e in enumerate(envs.env_ids)]
        obs, rewards, terms, truncs, infos = envs.step(actions)
        assert terms.all() and rewards.tolist() == [1.0] * 6
        assert infos["env_id"].tolist() == list(envs.env_ids)
    finally:
        envs.close()


@pytest.mark.slow
def test_given_servers_next_step_autoreset(launched):
    envs = _mixture(launched, 6, weights=(1, 2))
    try:
        assert list(envs.env_ids).count(f"NemoGym/{MULTI}-v0") == 4
        obs, infos = envs.reset(seed=0)
        histories = [[] for _ in range(6)]
        ended = {env_id: 0 for env_id in set(envs.env_ids)}
        for _ in range(10):
            before = envs.live_mask.copy()
            obs, rewards, terms, truncs, infos = envs.step(_actions(envs, histories, obs))
            assert infos["env_id"].tolist() == list(envs.env_ids)
            for i in range(6):
                if not before[i]:  # autoreset this step: a new task of the same environment
                    assert rewards[i] == 0.0 and obs[i]
                    assert envs.episodes[i].task in example_rows(_server(envs.env_ids[i]))
                    histories[i] = []
                elif terms[i]:
                    assert rewards[i] == 1.0
                    ended[envs.env_ids[i]] += 1
        assert all(n >= 2 for n in ended.values()), ended
    finally:
        envs.close()


@pytest.mark.slow
def test_given_servers_same_step_autoreset_names_final_info(launched):
    envs = _mixture(launched, 4, autoreset_mode=AutoresetMode.SAME_STEP)
    try:
        obs, _ = envs.reset(seed=1)
        histories = [[] for _ in range(4)]
        seen_final = np.zeros(4, dtype=bool)
        for _ in range(4):
            obs, rewards, terms, truncs, infos = envs.step(_actions(envs, histories, obs))
            if "_final_info" in infos:
                for i in np.flatnonzero(infos["_final_info"]):
                    assert infos["final_info"]["env_id"][i] == envs.env_ids[i]
                    assert infos["final_info"]["reward"][i] == 1.0 and rewards[i] == 1.0
                    histories[i] = []
                    seen_final[i] = True
            assert envs.live_mask.all()
        assert seen_final.all()
    finally:
        envs.close()


@pytest.mark.slow
def test_given_servers_disabled_autoreset_and_reset_mask(launched):
    envs = _mixture(launched, 4, autoreset_mode=AutoresetMode.DISABLED, assignment_seed=None)
    try:
        assert envs.env_ids == (f"NemoGym/{SINGLE}-v0",) * 2 + (f"NemoGym/{MULTI}-v0",) * 2
        obs, _ = envs.reset(seed=0)
        histories = [[] for _ in range(4)]
        for _ in range(4):
            obs, rewards, terms, truncs, infos = envs.step(_actions(envs, histories, obs))
        assert not envs.live_mask.any()
        with pytest.raises(ValueError, match="sub-env 3 has ended"):
            envs.step([None, None, None, "x"])
        obs, infos = envs.reset(options={"reset_mask": np.array([False, True, False, True]),
                                         "task_indices": [None, 2, None, 4]})
        assert envs.live_mask.tolist() == [False, True, False, True]
        assert obs[0] == [] and obs[1] and obs[3]
        assert infos["_env_id"].tolist() == [False, True, False, True]
        assert envs.episodes[1].task == example_rows(SINGLE)[2] and envs.episodes[3].task == example_rows(MULTI)[4]
    finally:
        envs.close()


@pytest.mark.slow
def test_a_bad_action_anywhere_plays_nothing_and_names_its_sub_env(launched):
    envs = _mixture(launched, 4, assignment_seed=None)
    try:
        envs.reset(seed=0)
        with pytest.raises(ActionError, match="sub-env 3"):
            envs.step(["hello", "hello", "hello", 42])
        assert [e.turn for e in envs.episodes] == [0, 0, 0, 0]
        with pytest.raises(ValueError, match="3 actions given"):
            envs.step(["a", "b", "c"])
    finally:
        envs.close()


@pytest.mark.slow
def test_mixture_rows_as_rollouts_input_are_routed_by_agent_ref(tmp_path):
    """``nemo-gym-env rollouts math mcqa -i mix.jsonl``: each row played, and verified, on its own server."""
    from ..cli.conftest import read_jsonl, run_cli

    rows = mixture_rows({"NemoGym/math-v0": 0.75, "NemoGym/mcqa-v0": 0.25}, 8, seed=0)
    source, out = tmp_path / "mix.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_cli("rollouts", "math", "mcqa", "--policy", "scripted", "-i", str(source), "-o", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    played = sorted(read_jsonl(out), key=lambda r: r["_ng_task_index"])
    assert [r["agent_ref"]["name"] for r in played] == [r["agent_ref"]["name"] for r in rows]
    assert [r[ENVIRONMENT_KEY] for r in played] == [r[ENVIRONMENT_KEY] for r in rows]
    # The scripted player answers right, so a reward of 1 means the row's own server verified it.
    assert [r["reward"] for r in played] == [1.0] * 8
    for row, source_row in zip(played, rows):
        assert row["expected_answer"] == source_row["expected_answer"]
