"""TRL adapter: train on any NeMo-Gym-style environment with TRL's ``GRPOTrainer``.

Two routes, both against the same resources servers as :class:`~nemo_gym_env.envs.env.NemoGymEnv`:

``rollout_func`` (token-exact multi-turn episodes, any policy text format)::

    from trl import GRPOConfig, GRPOTrainer
    from nemo_gym_env.adapters.trl import env_reward, nemo_gym_rollout_func, tasks_dataset

    trainer = GRPOTrainer(
        model=model, args=GRPOConfig(...), processing_class=tokenizer,
        train_dataset=tasks_dataset("NemoGym/example_multi_step-v0"),
        reward_funcs=[env_reward],
        rollout_func=nemo_gym_rollout_func("NemoGym/example_multi_step-v0", max_turns=6),
    )
    trainer.train()

``environment_factory`` (TRL runs the tool loop; the model's chat template must do tool calls
TRL can parse)::

    from nemo_gym_env.adapters.trl import nemo_gym_environment

    trainer = GRPOTrainer(..., train_dataset=tasks_dataset("NemoGym/example_single_tool_call-v0"),
                          environment_factory=nemo_gym_environment("NemoGym/example_single_tool_call-v0"))

Several environments in one run: ``environment_factory=nemo_gym_environments(envs)`` (a dict
of classes, TRL's multi-environment mode) with ``train_dataset=mixture_dataset(envs)``, whose
``environment`` column routes each row; ``envs`` is a mixture (env id -> weight), as
``gym.make_vec("NemoGym/Mixture-v0", envs=envs)`` takes it. With no ``train_dataset`` (one
environment, ``max_steps`` set), ``nemo_gym_environment(env_id, num_generations=G)`` draws
the tasks itself and ``reset`` returns their text.

One module per job: ``tasks`` (the dataset, and the task row behind a prompt), ``rewards``
(:func:`env_reward`), ``generation`` (the trainer's own generation: HF or vLLM),
``rollout`` (:class:`NemoGymRollout`), ``environment`` (:func:`nemo_gym_environment`). The
names below load on first use: ``tasks_dataset`` and ``env_reward`` do not import torch.

What TRL 1.16 does, read from its source and checked by ``tests/adapters/trl``: the trainer's
``RepeatSampler`` repeats every dataset row ``num_generations`` times in a row, and
``rollout_func(prompts, trainer)`` receives those repeated prompts (its docstring says "no
duplication"; the code and a recorded ``train()`` step say otherwise), so the rollout returns
exactly ``len(prompts)`` rows and the copies of a prompt play the same task. ``rollout_func``
gets the prompts only, not the other dataset columns, so :func:`tasks_dataset` also carries
the task row inside the prompt's first message (key :data:`TASK_ROW_FIELD`, ignored by chat
templates).

Per rollout row: ``prompt_ids`` (the first prompt, rendered by the tokenizer's chat template),
``completion_ids`` (the model's turns and the environment's tool outputs rendered with the
chat template, joined token by token: the model's tokens are never re-tokenized),
``logprobs`` (of the sampled tokens under the sampling distribution; 0.0 on environment
tokens), ``env_mask`` (1 model token, 0 environment token), and the extra fields
``env_reward`` (the ``/verify`` reward; None when the episode failed), ``num_turns``,
``truncated``, ``env_error`` and the verify reply's numeric metrics, which TRL hands to
reward functions as keyword arguments; when the verdict has ``reward_components``, the column
``reward_components`` (a dict per row) and one column ``component_<name>`` per component
(:func:`component_rewards` makes a reward function of each); when the server gave step rewards,
``step_rewards`` (one number per model turn) and ``step_reward_sum``. A server failure masks the row (``env_mask`` all 0,
``env_reward`` None, which TRL treats as unscorable) and never changes the row count. An
episode the rollout stops (the token budget, the turn limit) is verified on its trajectory so
far, with no made-up model turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_gym_env.imports import lazy_exports

if TYPE_CHECKING:
    from nemo_gym_env.adapters.trl.environment import nemo_gym_environment, nemo_gym_environments
    from nemo_gym_env.adapters.trl.generation import Generate, trainer_generate
    from nemo_gym_env.adapters.trl.progress import StepReport
    from nemo_gym_env.adapters.trl.rewards import component_rewards, env_reward, metric_rewards
    from nemo_gym_env.adapters.trl.rollout import NemoGymRollout, nemo_gym_rollout_func
    from nemo_gym_env.adapters.trl.shared_prompt import SharedPromptGRPOTrainer
    from nemo_gym_env.adapters.trl.tasks import TASK_ROW_FIELD, env_rows, mixture_dataset, tasks_dataset

__all__ = [
    "TASK_ROW_FIELD",
    "Generate",
    "NemoGymRollout",
    "SharedPromptGRPOTrainer",
    "StepReport",
    "component_rewards",
    "env_reward",
    "env_rows",
    "metric_rewards",
    "mixture_dataset",
    "nemo_gym_environment",
    "nemo_gym_environments",
    "nemo_gym_rollout_func",
    "tasks_dataset",
    "trainer_generate",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("TASK_ROW_FIELD", "env_rows", "mixture_dataset", "tasks_dataset"), "nemo_gym_env.adapters.trl.tasks"),
    **dict.fromkeys(("component_rewards", "env_reward", "metric_rewards"), "nemo_gym_env.adapters.trl.rewards"),
    "SharedPromptGRPOTrainer": "nemo_gym_env.adapters.trl.shared_prompt",
    "StepReport": "nemo_gym_env.adapters.trl.progress",
    **dict.fromkeys(("Generate", "trainer_generate"), "nemo_gym_env.adapters.trl.generation"),
    **dict.fromkeys(("NemoGymRollout", "nemo_gym_rollout_func"), "nemo_gym_env.adapters.trl.rollout"),
    **dict.fromkeys(("nemo_gym_environment", "nemo_gym_environments"), "nemo_gym_env.adapters.trl.environment"),
})
