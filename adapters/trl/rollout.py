"""The ``rollout_func`` route: multi-turn episodes played with the trainer's generation, token-exact.

:class:`NemoGymRollout` plays one episode per prompt, all of them at once: each turn it asks a
:data:`~nemo_gym_env.adapters.trl.generation.Generate` for every live episode's next tokens,
plays the decoded text in the env (tool calls go to the server), and appends the environment's
reply as the chat template renders it after the model's own tokens
(:meth:`~nemo_gym_env.policies.render.ChatRenderer.continuation`), so the model's tokens are
never re-tokenized. An episode stopped by the token budget, or left live when the turns run
out, is verified as it stands (:meth:`~nemo_gym_env.envs.episode.Episode.finish`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nemo_gym_env.adapters.trl.generation import Generate, any_live, eos_ids, tokenizer_of, trainer_generate
from nemo_gym_env.adapters.trl.rewards import RESERVED_FIELDS
from nemo_gym_env.adapters.trl.tasks import SharedEnv, TaskTable
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.episode import Episode, StepResult
from nemo_gym_env.envs.traits import begin_episode
from nemo_gym_env.errors import NoContinuation, ServerError
from nemo_gym_env.policies.chat import tools_to_chat
from nemo_gym_env.policies.render import ChatRenderer
from nemo_gym_env.protocol.dataset import input_items
from nemo_gym_env.protocol.metrics import numeric_fields
from nemo_gym_env.system.closing import Closing

if TYPE_CHECKING:
    from nemo_gym_env.envs.env import NemoGymEnv

__all__ = ["COMPONENT_PREFIX", "NemoGymRollout", "RolloutRow", "nemo_gym_rollout_func"]

COMPONENT_PREFIX = "component_"
"""Each reward component ``<name>`` of the ``/verify`` reply is the rollout column ``component_<name>``."""

_OWN_NUMBERS = frozenset({"reward", "step_reward_sum"})
"""Numbers of the verdict that have their own column (``env_reward``, ``step_reward_sum``) or none."""

log = logging.getLogger(__name__)



@dataclass
class RolloutRow:
    """One rollout row: its episode and its tokens."""

    episode: Episode
    tools: list[dict[str, Any]] | None
    chat_tools: list[dict[str, Any]]
    prompt_ids: list[int] = field(default_factory=list)
    observation: list[dict[str, Any]] | None = None
    """What the episode's start showed the model (None until it started)."""
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    num_turns: int = 0
    truncated: bool = False
    error: str | None = None

    @property
    def live(self) -> bool:
        return self.error is None and not self.episode.done

    def add(self, ids: list[int], logprobs: list[float | None] | None, from_model: bool) -> None:
        self.completion_ids += ids
        self.logprobs += list(logprobs) if from_model else [0.0] * len(ids)
        self.env_mask += [1 if from_model else 0] * len(ids)

    def fail(self, error: str) -> None:
        self.error = error[:1000]


def _cut(ids: list[int], logprobs: list[float | None], eos: set[int], budget: int) -> tuple[list[int], list[float | None]]:
    """The tokens of one turn: up to and including the first end-of-turn token, at most ``budget``."""
    end = next((n + 1 for n, token in enumerate(ids) if token in eos), len(ids))
    end = min(end, budget)
    return list(ids[:end]), list(logprobs[:end])


class NemoGymRollout(Closing):
    """A TRL ``rollout_func``: multi-turn episodes of one environment, token-exact.

    Build it with :func:`nemo_gym_rollout_func`. Calling it as ``rollout(prompts, trainer)``
    plays one episode per prompt, all of them concurrently on the background loop, with the
    trainer's own generation (see :func:`~nemo_gym_env.adapters.trl.generation.trainer_generate`),
    and returns the columns TRL needs (``nemo_gym_env.adapters.trl``'s docstring). The env (and
    its embedded server, when no ``base_url`` is given) starts at the first call and lives until
    :meth:`close`.

    Args:
        env_id: A registered id (``"NemoGym/<server>-v0"`` or ``"NemoGym/Generic-v0"``).
        max_turns: Model turns per episode; the env verifies at this limit (``truncated``).
        max_turn_tokens: Cap on the tokens of one model turn (default: what is left of
            ``max_completion_length``).
        engine: Without vLLM, in one process, generate on the package's continuous-batching engine
            (:func:`~nemo_gym_env.adapters.trl.generation.engine_generate`: a group's prompt prefilled once,
            each turn continuing the last); False: Hugging Face ``generate``, as TRL does.
        **env_kwargs: Passed to ``gym.make`` (``base_url``, ``dataset``, ``config_paths``,
            ``request_timeout_s``...); the env's ``max_steps`` is ``max_turns``.

    Attributes:
        last_rows: The rows of the last call (episodes, tokens), for inspection.
    """

    def __init__(self, env_id: str, *, max_turns: int = 6, max_turn_tokens: int | None = None, engine: bool = True,
                 **env_kwargs: Any):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_turn_tokens is not None and max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
        if "max_steps" in env_kwargs:
            raise TypeError("the env's max_steps is max_turns here; pass max_turns=..., not max_steps")
        self.env_id = env_id
        self.max_turns = max_turns
        self.max_turn_tokens = max_turn_tokens
        self.engine = engine
        self.env_kwargs = env_kwargs
        self._shared = SharedEnv(env_id, {"max_steps": max_turns, **env_kwargs})
        self._renderers: dict[int, ChatRenderer] = {}
        self.last_rows: list[RolloutRow] = []

    def __repr__(self) -> str:
        return f"NemoGymRollout({self.env_id!r}, max_turns={self.max_turns})"

    @property
    def env(self) -> NemoGymEnv:
        """The underlying :class:`~nemo_gym_env.envs.env.NemoGymEnv` (made, and its server started, on first use)."""
        return self._shared.get()[0]

    def close(self) -> None:
        """Close the env (stopping its embedded server when no other user holds it); safe to call twice."""
        self._shared.close()

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """The ``rollout_func`` entry point: ``len(prompts)`` rows generated by ``trainer``'s own model."""
        tokenizer = tokenizer_of(trainer)
        max_length = getattr(trainer, "max_completion_length", None) or trainer.args.max_completion_length
        generate = trainer_generate(trainer, engine=self.engine)
        try:
            return self.rollout(prompts, generate, tokenizer=tokenizer, max_completion_length=max_length,
                                eos_token_ids=eos_ids(trainer, tokenizer), any_live=any_live(trainer))
        finally:
            release = getattr(generate, "release", None)
            if callable(release):
                release()

    def rollout(self, prompts: list[Any], generate: Generate, *, tokenizer: Any, max_completion_length: int,
                eos_token_ids: Sequence[int] | None = None, any_live: Callable[[int], bool] | None = None) -> dict[str, list]:
        """Play one episode per prompt with ``generate`` and return TRL's rollout columns.

        Args:
            prompts: Conversational prompts from :func:`~nemo_gym_env.adapters.trl.tasks.tasks_dataset`
                (one per row; repeats play the same task).
            generate: See :data:`~nemo_gym_env.adapters.trl.generation.Generate`.
            tokenizer: Renders prompts and tool outputs (its chat template) and decodes model text.
            max_completion_length: Token budget of a whole episode's completion (model and
                environment tokens); an episode that would exceed it ends, verified and ``truncated``.
            eos_token_ids: End-of-turn tokens (default: the tokenizer's EOS).
            any_live: Turn barrier (see :func:`~nemo_gym_env.adapters.trl.generation.any_live`); default: local.
        """
        env, tasks = self._shared.get()
        renderer = self._renderer(tokenizer)
        eos = set(eos_token_ids or [tokenizer.eos_token_id])
        any_live = any_live or (lambda n: n > 0)
        loop = background_loop()

        rows = [self._new_row(prompt, env, tasks, renderer) for prompt in prompts]
        loop.run(self._start_all(rows, env.protocol))
        for row in rows:
            row.prompt_ids = self._prompt_ids(row, renderer, tokenizer)
        for _ in range(self.max_turns):
            live = [row.live for row in rows]
            if not any_live(sum(live)):
                break
            budgets = [self._budget(row, max_completion_length) for row in rows]
            outputs = generate([row.prompt_ids + row.completion_ids if ok else None for row, ok in zip(rows, live)],
                               budgets)
            playing, texts, ends = [], [], []
            for row, ok, budget, output in zip(rows, live, budgets, outputs):
                if not ok:
                    continue
                if output is None:
                    raise RuntimeError("the generation backend returned nothing for a live episode")
                ids, lps = _cut(output[0], output[1], eos, budget)
                row.add(ids, lps, from_model=True)
                row.num_turns += 1
                ends.append(tokenizer.decode([ids[-1]]) if ids and ids[-1] in eos else None)
                if (not ids or ids[-1] not in eos) and len(row.completion_ids) >= max_completion_length:
                    row.truncated = True  # cut by the token budget
                playing.append(row)
                texts.append(tokenizer.decode(ids, skip_special_tokens=True))
            results = loop.run(self._play_all(playing, texts))
            ending = []
            for row, result, end in zip(playing, results, ends):
                self._after_turn(row, result, end, renderer, tokenizer, max_completion_length, ending)
            if ending:
                loop.run(self._finish_all(ending))
        leftover = [row for row in rows if row.live]  # only when any_live was told otherwise
        if leftover:
            loop.run(self._finish_all(leftover))
        self.last_rows = rows
        columns = self._columns(rows, eos)
        failed = [error for error in columns["env_error"] if error is not None]
        if failed:
            log.warning("%s: %d of %d episodes failed and are masked out (first: %s)", self.env_id, len(failed),
                        len(rows), failed[0])
        return columns

    # ---- internals -------------------------------------------------------------------------

    def _renderer(self, tokenizer: Any) -> ChatRenderer:
        renderer = self._renderers.get(id(tokenizer))
        if renderer is None or renderer.tokenizer is not tokenizer:
            renderer = ChatRenderer(tokenizer)
            try:
                renderer.continuation([{"role": "user", "content": "x"}], None, None)
            except NoContinuation as exc:
                raise ValueError(
                    f"{exc}: multi-turn rollouts need a chat template that renders later turns as a suffix of "
                    "earlier ones (prefix-preserving); set tokenizer.chat_template to one (e.g. TRL's "
                    "trl.chat_template_utils.get_training_chat_template(tokenizer))"
                ) from None
            self._renderers = {id(tokenizer): renderer}
        return renderer

    def _new_row(self, prompt: Any, env: NemoGymEnv, tasks: TaskTable, renderer: ChatRenderer) -> RolloutRow:
        row, index = tasks.find(prompt)
        chat_tools = tools_to_chat(row["responses_create_params"].get("tools"))
        return RolloutRow(env.open_episode(row, index, self.max_turns), renderer.template_tools(chat_tools),
                          chat_tools)

    @staticmethod
    def _prompt_ids(row: RolloutRow, renderer: ChatRenderer, tokenizer: Any) -> list[int]:
        """The first prompt: what the episode's start showed (a Gymnasium-protocol server adds its
        first observation to the task's input), rendered by the chat template."""
        task = row.episode.task
        shown = row.observation if row.observation is not None else input_items(task)
        messages = renderer.messages(shown, [], row.chat_tools, task["responses_create_params"].get("instructions"))
        return list(tokenizer(renderer.render(messages, row.tools, True), add_special_tokens=False)["input_ids"])

    def _budget(self, row: RolloutRow, max_completion_length: int) -> int:
        left = max_completion_length - len(row.completion_ids)
        return max(1, min(left, self.max_turn_tokens or left))

    async def _start_all(self, rows: list[RolloutRow], protocol: str) -> None:
        async def start(row: RolloutRow) -> None:
            try:
                row.episode, row.observation, _ = await begin_episode(row.episode, protocol)
            except ServerError as exc:
                row.fail(str(exc))

        await asyncio.gather(*(start(row) for row in rows))

    async def _play_all(self, rows: list[RolloutRow], texts: list[str]) -> list[StepResult]:
        return await asyncio.gather(*(row.episode.play(normalize_action(text, turn=row.episode.turn))
                                      for row, text in zip(rows, texts)))

    async def _finish_all(self, rows: list[RolloutRow]) -> None:
        """Verify live episodes as they stand: the trajectory so far, no made-up model turn."""
        await asyncio.gather(*(row.episode.finish() for row in rows))
        for row in rows:
            row.truncated = True
            if row.episode.error is not None:
                row.fail(str(row.episode.error))

    def _after_turn(self, row: RolloutRow, result: StepResult, generated_end: str | None, renderer: ChatRenderer,
                    tokenizer: Any, max_completion_length: int, ending: list[RolloutRow]) -> None:
        observation, _, _, truncated, _ = result
        if row.episode.error is not None:
            row.fail(str(row.episode.error))
            return
        if row.episode.done:
            row.truncated = row.truncated or truncated
            return
        messages = renderer.env_messages(observation, history=row.episode.trajectory)
        text = renderer.continuation(messages, row.tools, generated_end)
        env_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(row.completion_ids) + len(env_ids) >= max_completion_length:
            ending.append(row)  # no room for the tool outputs and one more model token
            return
        row.add(env_ids, None, from_model=False)

    def _columns(self, rows: list[RolloutRow], eos: set[int]) -> dict[str, list]:
        filler = min(eos)
        columns: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                     "env_reward", "num_turns", "truncated", "env_error")}
        metrics: list[dict[str, float]] = []
        parts: list[dict[str, float]] = []
        steps: list[list[float] | None] = []
        for row in rows:
            completion, logprobs, mask = row.completion_ids, row.logprobs, row.env_mask
            # A /verify reply that judged nothing (a verify timeout, mask_sample: true) failed the
            # episode (row.error): out of the loss and of the group's baseline (no reward), not scored 0.
            verify = row.episode.verdict() if row.error is None else None
            if row.error is not None or verify is None:
                mask = [0] * len(completion)
                if row.error is None:
                    row.fail("the episode ended without a /verify reply")
            if not completion:  # TRL needs at least one token per completion
                completion, logprobs, mask = [filler], [0.0], [0]
            columns["prompt_ids"].append(row.prompt_ids)
            columns["completion_ids"].append(completion)
            columns["logprobs"].append(logprobs)
            columns["env_mask"].append(mask)
            columns["env_reward"].append(None if verify is None else float(verify["reward"]))
            columns["num_turns"].append(row.num_turns)
            columns["truncated"].append(row.truncated)
            columns["env_error"].append(row.error)
            row_fields = set(row.episode.task)
            metrics.append({} if verify is None else {
                k: v for k, v in numeric_fields(verify).items() if k not in _OWN_NUMBERS and k not in row_fields})
            parts.append({} if verify is None or not isinstance(verify.get("reward_components"), dict)
                         else dict(verify["reward_components"]))
            steps.append(None if verify is None else list(row.episode.step_rewards))
        for name in sorted({k for m in metrics for k in m}):
            column = name if name not in RESERVED_FIELDS else f"verify_{name}"
            columns[column] = [m.get(name) for m in metrics]
        if any(parts):
            columns["reward_components"] = [p or None for p in parts]
            for name in sorted({k for p in parts for k in p}):
                columns[COMPONENT_PREFIX + name] = [p.get(name) for p in parts]
        if any(row.episode.gave_step_rewards or row.episode.episode_reward == "sum" for row in rows):
            columns["step_rewards"] = steps
            columns["step_reward_sum"] = [None if s is None else float(sum(s)) for s in steps]
        return columns


def nemo_gym_rollout_func(env_id: str, *, max_turns: int = 6, max_turn_tokens: int | None = None,
                          engine: bool = True, **env_kwargs: Any) -> NemoGymRollout:
    """A TRL ``rollout_func`` playing ``env_id``'s episodes; see :class:`NemoGymRollout`.

    Example (a bundled server, started on first use)::

        rollout = nemo_gym_rollout_func("NemoGym/example_multi_step-v0", max_turns=6)
        GRPOTrainer(..., reward_funcs=[env_reward], rollout_func=rollout)
    """
    return NemoGymRollout(env_id, max_turns=max_turns, max_turn_tokens=max_turn_tokens, engine=engine, **env_kwargs)
