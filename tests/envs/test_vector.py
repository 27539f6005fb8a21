"""Functional tests of the native vector env against real server processes."""

from __future__ import annotations

import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import nemo_gym_env  # noqa: F401
from nemo_gym_env import ActionError, NemoGymEnv
from nemo_gym_env.envs.vector import NemoGymVectorEnv

from ..conftest import example_rows, scripted

pytestmark = pytest.mark.slow

SERVER = "example_multi_step"


def _vec(launched, num_envs, server=SERVER, **kwargs):
    return NemoGymVectorEnv(base_url=launched[server], dataset=example_rows(server), num_envs=num_envs, **kwargs)


def _actions(envs, histories, obs, correct=True, server=SERVER):
    player = scripted(server)
    actions = []
    for i, episode in enumerate(envs.episodes):
        if not envs.live_mask[i]:
            actions.append(None)
            continue
        histories[i].extend(o for o in obs[i] if o.get("type") == "function_call_output")
        actions.append(player(episode.task, histories[i], correct=correct))
    return actions


def test_make_vec_uses_the_native_vector_env():
    envs = gym.make_vec("NemoGym/example_single_tool_call-v0", num_envs=3)
    try:
        assert isinstance(envs.unwrapped, NemoGymVectorEnv)
        obs, infos = envs.reset(seed=0)
        assert len(obs) == 3 and infos["task_index"].shape == (3,)
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_sync_and_async_modes_still_work(mode):
    kwargs = {"vector_kwargs": {"shared_memory": False}} if mode == "async" else {}
    envs = gym.make_vec("NemoGym/example_single_tool_call-v0", num_envs=2, vectorization_mode=mode, **kwargs)
    try:
        envs.reset(seed=0)
        call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
        envs.step((call, call))
        _, rewards, terminations, _, _ = envs.step(("ok", "ok"))
        assert rewards.tolist() == [1.0, 1.0] and terminations.all()
    finally:
        envs.close()


def test_next_step_autoreset_and_none_actions(launched):
    envs = _vec(launched, 8)
    obs, _ = envs.reset(seed=0)
    histories = [[] for _ in range(8)]
    finished = 0
    rewards_seen = []
    for _ in range(12):
        actions = _actions(envs, histories, obs)
        before = envs.live_mask.copy()
        obs, rewards, terms, truncs, infos = envs.step(actions)
        for i in range(8):
            if not before[i]:  # autoreset happened this step
                assert rewards[i] == 0.0 and not terms[i] and not truncs[i] and obs[i]
                histories[i] = []
            elif terms[i] or truncs[i]:
                finished += 1
                rewards_seen.append(rewards[i])
    assert finished >= 8 and set(rewards_seen) == {1.0}
    envs.close()


def test_same_step_autoreset_reports_final_obs_and_info(launched):
    envs = _vec(launched, 4, autoreset_mode=AutoresetMode.SAME_STEP)
    obs, _ = envs.reset(seed=0)
    histories = [[] for _ in range(4)]
    for _ in range(3):
        obs, rewards, terms, truncs, infos = envs.step(_actions(envs, histories, obs))
    assert terms.all() and rewards.tolist() == [1.0] * 4
    assert infos["_final_obs"].all() and infos["_final_info"].all()
    assert infos["final_info"]["reward"].tolist() == [1.0] * 4
    assert all(o for o in obs)  # already the next episode's first observation
    assert envs.live_mask.all()
    envs.close()


def test_disabled_autoreset_needs_reset_mask(launched):
    envs = _vec(launched, 3, autoreset_mode=AutoresetMode.DISABLED)
    obs, _ = envs.reset(seed=0)
    histories = [[] for _ in range(3)]
    for _ in range(3):
        obs, rewards, terms, truncs, infos = envs.step(_actions(envs, histories, obs))
    assert terms.all()
    with pytest.raises(ValueError, match="reset_mask"):
        envs.step(["x", None, None])
    obs, rewards, terms, truncs, _ = envs.step([None, None, None])
    assert not terms.any() and rewards.tolist() == [0.0] * 3
    obs, infos = envs.reset(options={"reset_mask": np.array([True, False, True])})
    assert obs[0] and obs[2] and obs[1] == []
    assert envs.live_mask.tolist() == [True, False, True]
    envs.close()


def test_per_env_tasks_by_seed_list_and_task_indices(launched):
    envs = _vec(launched, 3)
    _, infos = envs.reset(options={"task_indices": [4, 0, 2]})
    assert infos["task_index"].tolist() == [4, 0, 2]
    _, a = envs.reset(seed=[7, 8, 9])
    _, b = envs.reset(seed=[7, 8, 9])
    assert a["task_index"].tolist() == b["task_index"].tolist()
    with pytest.raises(ValueError, match="task_indices"):
        envs.reset(options={"task_indices": [1]})
    with pytest.raises(ValueError, match="unknown reset options"):
        envs.reset(options={"bogus": 1})
    envs.close()


def test_equivalence_with_single_env(launched):
    """The same seeds and actions give the same observations and rewards."""
    seeds = [3, 11, 5]
    envs = _vec(launched, 3)
    single = NemoGymEnv(base_url=launched[SERVER], dataset=example_rows(SERVER))
    vobs, _ = envs.reset(seed=seeds)
    histories = [[] for _ in range(3)]
    vector_trace = []
    for _ in range(3):
        vobs, rewards, terms, truncs, _ = envs.step(_actions(envs, histories, vobs))
        vector_trace.append((vobs, rewards.tolist(), terms.tolist()))
    for i, seed in enumerate(seeds):
        obs, _ = single.reset(seed=seed)
        assert single.task == envs.episodes[i].task
        history = []
        for turn in range(3):
            obs, reward, term, _, _ = single.step(scripted(SERVER)(single.task, history))
            history.extend(obs)
            assert obs == vector_trace[turn][0][i]
            assert reward == vector_trace[turn][1][i] and term == vector_trace[turn][2][i]
    single.close()
    envs.close()


def test_bad_action_names_sub_env_and_changes_nothing(launched):
    envs = _vec(launched, 2)
    envs.reset(seed=0)
    with pytest.raises(ActionError, match="sub-env 1"):
        envs.step(["hello", 42])
    with pytest.raises(ValueError, match="needs an action"):
        envs.step(["hello", None])
    assert [e.turn for e in envs.episodes] == [0, 0]
    envs.close()


def test_killed_server_truncates_its_episodes_only():
    """Two servers; killing one truncates its sub-envs with an error, the other env goes on."""
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher() as launcher:
        doomed = launcher.start(bundled_spec(SERVER))
        envs = NemoGymVectorEnv(base_url=doomed.url, dataset=example_rows(SERVER), num_envs=4, request_timeout_s=5)
        obs, _ = envs.reset(seed=0)
        histories = [[] for _ in range(4)]
        actions = _actions(envs, histories, obs)
        os.killpg(doomed.pid, signal.SIGKILL)
        time.sleep(0.3)
        started = time.monotonic()
        obs, rewards, terms, truncs, infos = envs.step(actions)
        assert time.monotonic() - started < 30
        assert truncs.all() and not terms.any()
        assert all("get_synonym_value" in e for e in infos["error"])
        envs.close()


def test_one_failing_sub_env_does_not_stop_the_others(launched):
    """Per-request failures are isolated: a hanging tool call times out only its sub-env."""
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    envs = _vec(launched, 3, request_timeout_s=5)
    obs, _ = envs.reset(seed=0)
    histories = [[] for _ in range(3)]
    actions = _actions(envs, histories, obs)
    with Launcher() as launcher:  # point sub-env 1 at a server that is then stopped
        other = launcher.start(bundled_spec(SERVER))
        envs.episodes[1].client = type(envs.client)(other.url, timeout_s=5)
    obs, rewards, terms, truncs, infos = envs.step(actions)
    assert truncs.tolist() == [False, True, False]
    assert infos["_error"].tolist() == [False, True, False]
    assert obs[0] and obs[2]
    envs.close()


def test_a_verify_that_judged_nothing_is_truncated_and_masked_not_a_reward():
    """A verify timeout ends its sub-env truncated with the reason and mask_sample, reward 0.0 that is no
    score; a wrong answer beside it is an ordinary reward (terminated)."""
    from nemo_gym_env.launch.launcher import Launcher

    from ..fixtures import fixture_specs

    task = {"responses_create_params": {"input": [{"role": "user", "content": "Say done."}]}}
    rows = [dict(task, reward=0.0, failure_kind="verify_timeout", failure_reason="ran out of time"),
            dict(task, reward=0.0, failure_kind="wrong_answer"), dict(task, reward=1.0)]
    with Launcher() as launcher:
        url = launcher.start(fixture_specs("rewards")["rewards"]).url
        envs = NemoGymVectorEnv(base_url=url, dataset=rows, num_envs=3)
        envs.reset(options={"task_indices": [0, 1, 2]})
        _, rewards, terms, truncs, infos = envs.step(["done"] * 3)
        envs.close()
    assert rewards.tolist() == [0.0, 0.0, 1.0]
    assert terms.tolist() == [False, True, True] and truncs.tolist() == [True, False, False]
    assert infos["_mask_sample"].tolist() == [True, False, False] and bool(infos["mask_sample"][0])
    assert "verify_timeout (infrastructure; no reward): ran out of time" in infos["error"][0]
    assert infos["_error"].tolist() == [True, False, False]
    assert infos["failure_kind"][1] == "wrong_answer"


def test_base_url_list_pins_each_sub_env_to_one_server():
    """Sharding over single-worker servers: sub-env i always plays on urls[i % n], so per-process
    session state (the counter server) is found at /verify; rewards prove no episode hopped."""
    import dataclasses

    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    server = "example_session_state_mgmt"
    with Launcher() as launcher:
        spec = bundled_spec(server)
        second = dataclasses.replace(spec, instance_name=spec.instance_name + "_b")
        urls = [launcher.start(spec).url, launcher.start(second).url]
        envs = NemoGymVectorEnv(base_url=urls, dataset=example_rows(server), num_envs=4)
        obs, _ = envs.reset(seed=0)
        assert [e.client.base_url for e in envs.episodes] == [urls[0], urls[1], urls[0], urls[1]]
        histories = [[] for _ in range(4)]
        finished = []
        for _ in range(8):
            actions = _actions(envs, histories, obs, server=server)
            obs, rewards, terms, truncs, infos = envs.step(actions)
            finished += [rewards[i] for i in range(4) if terms[i] or truncs[i]]
            if len(finished) >= 4:
                break
        assert finished == [1.0] * 4 and "_error" not in infos
        assert [e.client.base_url for e in envs.episodes] == [urls[0], urls[1], urls[0], urls[1]]
        with pytest.raises(ValueError, match="empty list"):
            NemoGymVectorEnv(base_url=[], dataset=example_rows(server))
        envs.close()


def test_make_vec_plays_a_gymnasium_protocol_server():
    """The bundled guess_number game (``/reset``, ``/step``): per-step rewards, hints as user messages."""
    player = scripted("guess_number")
    envs = gym.make_vec("NemoGym/guess_number-v0", num_envs=2)
    try:
        obs, infos = envs.reset(seed=0, options={"task_indices": [1, 1]})
        assert [o[-1]["content"].startswith("I am thinking of a whole number from 1 to 50") for o in obs] == [True] * 2
        rows = [episode.task for episode in envs.unwrapped.episodes]
        histories: list[list] = [[], []]
        returns = [0.0, 0.0]
        done = [False, False]
        for _ in range(rows[1]["max_guesses"]):
            live = envs.unwrapped.live_mask
            actions = [None if not live[i] else player(envs.unwrapped.episodes[i].task, [] if done[i] else histories[i],
                                                       correct=(i == 0)) for i in range(2)]
            obs, rewards, terms, truncs, infos = envs.step(actions)
            for i in range(2):
                if not done[i]:
                    returns[i] += float(rewards[i])
                    histories[i].extend(obs[i])
                    done[i] = bool(terms[i] or truncs[i])
            if all(done):
                break
        assert done == [True, True] and returns == [1.0, 0.0]
        assert any(o["content"].startswith(("Higher.", "Lower.")) for o in histories[1])
    finally:
        envs.close()
