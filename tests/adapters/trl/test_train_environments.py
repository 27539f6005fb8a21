"""TRL 1.16's environment surface, each with a real ``GRPOTrainer.train()`` step (slow, CPU):

- ``environment_factory`` given a dict (multi-environment training): a mixture dataset's
  ``environment`` column routes each row to its environment's class and tools;
- environments owning the reward through ``get_reward()``, with no ``reward_funcs`` at all;
- no ``train_dataset``: the environment draws the tasks and returns their text from ``reset``, and the
  model's tool calls (TRL's own tool loop) reach the server's tools.

SmolLM2 wears TRL's Qwen2.5 chat template (the same ChatML tokens), which TRL can render tools
into and parse tool calls from, as in ``test_train.py``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

import nemo_gym_env  # noqa: F401
from nemo_gym_env.adapters.trl import env_rows, mixture_dataset, nemo_gym_environment, nemo_gym_environments

from ..conftest import secret_rows, secret_spec, verify_log
from .test_train import grpo_config

# TRL 1.16 itself reads the model's is_gradient_checkpointing (unwrap_model_for_generation,
# disable_gradient_checkpointing), which transformers 5.x deprecates; our configs use the new name
# (checkpointing()), so that is the only FutureWarning left, and not ours to fix.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]

WEATHER = "example_single_tool_call"


@pytest.fixture
def one_thread():
    """One torch thread (as in test_train.py): on a small machine OpenMP's second thread mostly spins."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tool_tokenizer(tokenizer):
    import trl

    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    return tokenizer


def test_dict_environment_factory_routes_rows_and_owns_the_rewards(tmp_path, model_dir, tokenizer, one_thread):
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    with Launcher() as launcher:
        secret_url = launcher.start(secret_spec()).url
        weather_url = launcher.start(bundled_spec(WEATHER)).url
        envs = {"NemoGym/Generic-v0": {"weight": 1, "base_url": secret_url, "dataset": secret_rows()},
                f"NemoGym/{WEATHER}-v0": {"weight": 1, "base_url": weather_url}}
        dataset = mixture_dataset(envs, 2, seed=0)  # one row of each: one generation batch holds both
        assert sorted(dataset["environment"]) == sorted(envs)
        factories = nemo_gym_environments(envs)
        try:
            trainer = GRPOTrainer(
                model=AutoModelForCausalLM.from_pretrained(model_dir),
                args=grpo_config(tmp_path, max_steps=1, num_generations=2, gradient_accumulation_steps=2,
                                 max_completion_length=48, max_tool_calling_iterations=2),
                train_dataset=dataset, processing_class=_tool_tokenizer(tokenizer), environment_factory=factories)
            # Rewards: only the environments' own get_reward (no reward_funcs), one column per class.
            assert trainer.reward_func_names == [cls.__name__ for cls in factories.values()]
            trainer.train()
            secret_log = verify_log(secret_url)
        finally:
            for cls in factories.values():
                cls.close()
    assert trainer.state.global_step == 1
    # The last batch: 4 rollouts (2 rows x 2 generations), each played by its own row's environment class.
    names = trainer._batch_environments
    assert sorted(names) == sorted([*envs] * 2)
    for name, env in zip(names, trainer.environments):
        assert type(env) is factories[name]
        own_rows = secret_rows() if name == "NemoGym/Generic-v0" else env_rows(WEATHER)
        assert env._episode.task in own_rows
    # Each class's reward column is the mean of its own episodes' /verify rewards (the others' rows are None).
    log = trainer.state.log_history[0]
    for name, cls in factories.items():
        rewards = [env.get_reward() for n, env in zip(names, trainer.environments) if n == name]
        assert len(rewards) == 2 and None not in rewards
        assert log[f"rewards/{cls.__name__}/mean"] == pytest.approx(sum(rewards) / 2, rel=1e-5)
    secret_rewards = [env.get_reward() for n, env in zip(names, trainer.environments) if n == "NemoGym/Generic-v0"]
    assert sorted(secret_log) == sorted(secret_rewards)  # verified by that server, once each


def test_environment_factory_without_a_dataset_calls_the_server_tools_and_draws_a_task_per_group(
        tmp_path, model_dir, tokenizer, one_thread):
    """TRL's own tool loop with our class and no ``train_dataset``: the env draws each group's task, the model's
    tool calls reach the server, the rewards are the server's ``/verify`` replies."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from nemo_gym_env.launch.launcher import Launcher

    rows = secret_rows()
    with Launcher() as launcher:
        url = launcher.start(secret_spec()).url
        Env = nemo_gym_environment("NemoGym/Generic-v0", base_url=url, dataset=rows, num_generations=4, seed=0)
        try:
            trainer = GRPOTrainer(
                model=AutoModelForCausalLM.from_pretrained(model_dir),
                args=grpo_config(tmp_path, max_steps=1, num_generations=4, gradient_accumulation_steps=4,
                                 max_completion_length=48, max_tool_calling_iterations=2),
                processing_class=_tool_tokenizer(tokenizer), environment_factory=Env)  # no train_dataset
            assert [tool.__name__ for tool in trainer.tools] == ["get_word"]
            trainer.train()
            server = verify_log(url)
        finally:
            Env.close()
    assert trainer.state.global_step == 1
    environments = trainer.environments
    assert len(environments) == 8
    tasks = [env._episode.task for env in environments]
    assert all(task == tasks[0] for task in tasks[:4]) and all(task == tasks[4] for task in tasks[4:])  # per group
    assert all(task in rows for task in tasks)
    rewards = [env.get_reward() for env in environments]  # already verified: the same replies again
    assert None not in rewards and sorted(rewards) == sorted(server)
    assert trainer.state.log_history[0][f"rewards/{Env.__name__}/mean"] == pytest.approx(sum(rewards) / 8, rel=1e-5)
    calls = [item for env in environments for item in env._episode.trajectory if item["type"] == "function_call"]
    assert calls, "the model made no tool call: nothing reached the server's tools"
    assert all(call["name"] == "get_word" for call in calls)
    # Answered from the session the reset seeded: one of its words, or the range of its words (an unseeded
    # session answers neither).
    seeded = [item["output"] for env in environments for item in env._episode.trajectory
              if item["type"] == "function_call_output" and item["output"] in (
                  *(json.dumps({"word": w}, separators=(",", ":")) for w in env._episode.task["words"]),
                  json.dumps({"error": f"n must be between 1 and {len(env._episode.task['words'])}"},
                             separators=(",", ":")))]
    assert seeded, calls


def test_a_dict_factory_without_a_dataset_is_trls_error(tmp_path, model_dir, tokenizer):
    """TRL allows no train_dataset only for a single environment: a mixture needs its dataset."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    factories = nemo_gym_environments({f"NemoGym/{WEATHER}-v0": 1, "NemoGym/example_session_state_mgmt-v0": 1})
    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=grpo_config(tmp_path, max_steps=1),
                    processing_class=_tool_tokenizer(tokenizer), environment_factory=factories)
