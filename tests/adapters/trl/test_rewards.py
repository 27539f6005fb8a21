"""The reward function of the ``rollout_func`` route (``nemo_gym_env.adapters.trl.rewards``)."""

from __future__ import annotations

from nemo_gym_env.adapters.trl import env_reward


def test_env_reward_passes_rewards_and_logs_episode_metrics():
    logged = {}
    rewards = env_reward(["a", "b", "c"], env_reward=[1.0, None, 0.5], num_turns=[2, 1, 3],
                         truncated=[False, True, False], log_metric=logged.__setitem__)
    assert rewards == [1.0, None, 0.5]
    assert logged == {"env/num_turns": 2.0, "env/truncated": 1 / 3, "env/failed": 1 / 3}


def test_metric_rewards_hand_trl_a_verify_field_and_leave_failed_episodes_unscorable():
    import pytest

    from nemo_gym_env.adapters.trl import metric_rewards

    looked_up, turns = metric_rewards(["looked_up", "num_turns"])
    assert looked_up.__name__ == "metric_looked_up" and turns.__name__ == "metric_num_turns"
    columns = {"env_reward": [1.0, None, 0.0], "looked_up": [1.0, 0.5, 0.5], "verify_num_turns": [2, 3, 1],
               "num_turns": [9, 9, 9]}
    assert looked_up(["a", "b", "c"], **columns) == [1.0, None, 0.5]  # the failed episode stays unscorable
    assert turns(["a", "b", "c"], **columns) == [2.0, None, 1.0]  # a name the rollout uses: its verify_ column
    assert looked_up(["a"], env_reward=[1.0]) == [None]  # a verdict without the field
    with pytest.raises(ValueError, match="not a finite number"):
        looked_up(["a"], env_reward=[1.0], looked_up=[float("nan")])
    with pytest.raises(ValueError, match="needs the columns of nemo_gym_rollout_func"):
        looked_up(["a"], looked_up=[1.0])
    for bad in ([], ["x", "x"], [""], [3]):
        with pytest.raises(ValueError):
            metric_rewards(bad)
