"""The reward function of the ``rollout_func`` route (``nemo_gym_env.adapters.trl.rewards``)."""

from __future__ import annotations

from nemo_gym_env.adapters.trl import env_reward


def test_env_reward_passes_rewards_and_logs_episode_metrics():
    logged = {}
    rewards = env_reward(["a", "b", "c"], env_reward=[1.0, None, 0.5], num_turns=[2, 1, 3],
                         truncated=[False, True, False], log_metric=logged.__setitem__)
    assert rewards == [1.0, None, 0.5]
    assert logged == {"env/num_turns": 2.0, "env/truncated": 1 / 3, "env/failed": 1 / 3}
