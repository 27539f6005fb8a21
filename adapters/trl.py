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

What TRL 1.16 does, read from its source and checked by ``tests/adapters``: the trainer's
``RepeatSampler`` repeats every dataset row ``num_generations`` times in a row, and
``rollout_func(prompts, trainer)`` receives those repeated prompts (its docstring says "no
duplication"; the code and a recorded ``train()`` step say otherwise), so the rollout returns
exactly ``len(prompts)`` rows and the copies of a prompt play the same task. ``rollout_func``
gets the prompts only, not the other dataset columns, so :func:`tasks_dataset` also carries
the task row inside the prompt's first message (key :data:`TASK_KEY`, ignored by chat
templates).

Per rollout row: ``prompt_ids`` (the first prompt, rendered by the tokenizer's chat template),
``completion_ids`` (the model's turns and the environment's tool outputs rendered with the
chat template, joined token by token: the model's tokens are never re-tokenized),
``logprobs`` (of the sampled tokens under the sampling distribution; 0.0 on environment
tokens), ``env_mask`` (1 model token, 0 environment token), and the extra fields
``env_reward`` (the ``/verify`` reward; None when the episode failed), ``num_turns``,
``truncated``, ``env_error`` and the verify reply's numeric metrics, which TRL hands to
reward functions as keyword arguments. A server failure masks the row (``env_mask`` all 0,
``env_reward`` None, which TRL treats as unscorable) and never changes the row count.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import keyword
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

import gymnasium as gym
import torch

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.episode import Episode
from nemo_gym_env.errors import NoContinuation as _NoContinuation
from nemo_gym_env.errors import ServerError
from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers
from nemo_gym_env.policies.chat import tools_to_chat
from nemo_gym_env.policies.render import ChatRenderer as _Renderer
from nemo_gym_env.protocol.dataset import input_items, load_rows
from nemo_gym_env.protocol.items import content_text
from nemo_gym_env.protocol.metrics import numeric_fields
from nemo_gym_env.protocol.parser import items_to_text

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "TASK_KEY",
    "Generate",
    "NemoGymRollout",
    "env_reward",
    "env_rows",
    "nemo_gym_environment",
    "nemo_gym_rollout_func",
    "tasks_dataset",
    "trainer_generate",
]

log = logging.getLogger(__name__)

TASK_KEY = "nemo_gym_task"
"""Key of the task row (JSON) on the first message of every prompt :func:`tasks_dataset` writes."""

_RESERVED_FIELDS = frozenset({
    "prompt", "prompts", "completion", "completions", "completion_ids", "task", "task_index", "trainer_state",
    "log_extra", "log_metric", "environments", "prompt_ids", "logprobs", "env_mask", "env_reward",
    "num_turns", "truncated", "env_error",
})

# ---- tasks ---------------------------------------------------------------------------------------


def env_rows(source: str | Path | Sequence[dict[str, Any]], **env_kwargs: Any) -> list[dict[str, Any]]:
    """The task rows of an env id, a bundled server name, a JSONL path or a list of rows.

    Nothing is started: for an env id the rows come from its registered ``dataset`` (or
    ``env_kwargs["dataset"]``), else from the bundled server's ``data/example.jsonl``.

    Example:
        >>> len(env_rows("NemoGym/example_single_tool_call-v0")) > 0
        True
    """
    if not isinstance(source, (str, Path)):
        return load_rows(list(source))
    text = str(source)
    if text in gym.registry:
        kwargs = {**(gym.spec(text).kwargs or {}), **env_kwargs}
        if kwargs.get("dataset") is not None:
            return load_rows(kwargs["dataset"])
        if kwargs.get("server") is not None and kwargs.get("config_paths") is None:
            return load_rows(bundled_dataset(kwargs["server"]))
        raise ValueError(f"{text} has no default dataset here; pass dataset=... (a JSONL path or a list of rows)")
    if text in bundled_servers():
        return load_rows(bundled_dataset(text))
    if Path(text).is_file():
        return load_rows(text)
    raise ValueError(f"{text!r} is neither a registered env id (import nemo_gym_env), a bundled server "
                     f"({', '.join(sorted(bundled_servers()))}) nor a JSONL file")


def _chat_messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """The row's input (and ``instructions``) as plain ``{"role", "content"}`` chat messages."""
    params = row["responses_create_params"]
    messages = [{"role": "system", "content": params["instructions"]}] if params.get("instructions") else []
    for item in input_items(row):
        kind, role = item.get("type", "message"), item.get("role")
        if kind == "message" and role in ("system", "developer", "user", "assistant"):
            messages.append({"role": "system" if role == "developer" else role, "content": content_text(item.get("content"))})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": content_text(item.get("output"))})
        else:  # a model item in the input: shown as the assistant's text
            messages.append({"role": "assistant", "content": items_to_text([item])})
    return messages


def _messages_key(messages: Sequence[dict[str, Any]]) -> str:
    return json.dumps([(m.get("role"), m.get("content")) for m in messages], ensure_ascii=False)


def _row_key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, ensure_ascii=False)


def tasks_dataset(source: str | Path | Sequence[dict[str, Any]], **env_kwargs: Any) -> Dataset:
    """A TRL training dataset of NeMo Gym task rows.

    Columns: ``prompt`` (the row's input as conversational chat messages, ``developer``
    becoming ``system``), ``task`` (the row as a JSON string: reward functions receive it, and
    the environment built by :func:`nemo_gym_environment` seeds its session with it) and
    ``task_index``. ``rollout_func`` only sees the prompts, so the first message also carries
    the row under :data:`TASK_KEY`.

    Args:
        source: An env id (``"NemoGym/example_multi_step-v0"``), a bundled server name, a JSONL
            path, or a list of rows.
        **env_kwargs: ``dataset=...`` for env ids without a default dataset (``NemoGym/Generic-v0``).

    Example:
        >>> ds = tasks_dataset("NemoGym/example_single_tool_call-v0")
        >>> ds[0]["prompt"][-1]["role"], json.loads(ds[0]["task"])["responses_create_params"]["tools"][0]["name"]
        ('user', 'get_weather')
    """
    from datasets import Dataset

    records = []
    for index, row in enumerate(env_rows(source, **env_kwargs)):
        messages = _chat_messages(row)
        task = json.dumps(row, ensure_ascii=False)
        messages = [{**m, TASK_KEY: task if n == 0 else None} for n, m in enumerate(messages)]
        records.append({"prompt": messages, "task": task, "task_index": index})
    return Dataset.from_list(records)


class _TaskTable:
    """Finds the task row of a prompt: the row it carries, or a row of the env with the same messages."""

    def __init__(self, rows: Sequence[dict[str, Any]]):
        self.index_by_row = {_row_key(row): i for i, row in enumerate(rows)}
        self.by_messages: dict[str, int | None] = {}
        for i, row in enumerate(rows):
            key = _messages_key(_chat_messages(row))
            self.by_messages[key] = None if key in self.by_messages else i  # None: ambiguous
        self.rows = list(rows)
        self._carried: dict[str, tuple[dict[str, Any], int | None]] = {}

    def find(self, prompt: Any) -> tuple[dict[str, Any], int | None]:
        first = prompt[0] if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) else {}
        carried = first.get(TASK_KEY)
        if isinstance(carried, str):
            found = self._carried.get(carried)
            if found is None:  # validated once per task, not once per prompt and step
                row = load_rows([json.loads(carried)])[0]
                found = self._carried[carried] = (row, self.index_by_row.get(_row_key(row)))
                if len(self._carried) > 65536:
                    self._carried.clear()
            return found
        if isinstance(prompt, list):
            index = self.by_messages.get(_messages_key(prompt), -1)
            if index is not None and index >= 0:
                return self.rows[index], index
            if index is None:
                raise ValueError("two task rows share this prompt; build the dataset with tasks_dataset(...) so "
                                 "each prompt carries its task")
        raise ValueError(f"cannot tell which task this prompt is ({str(prompt)[:200]}); build the training "
                         "dataset with nemo_gym_env.adapters.trl.tasks_dataset(...)")


# ---- rewards -------------------------------------------------------------------------------------


def env_reward(completions: list[Any], env_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """The reward function of the ``rollout_func`` route: each episode's ``/verify`` reward.

    None (a failed episode) makes TRL treat the sample as unscorable. When TRL passes
    ``log_metric``, also logs ``env/num_turns``, ``env/truncated`` and ``env/failed`` (batch means).

    Example:
        >>> env_reward(["a", "b"], env_reward=[1.0, None])
        [1.0, None]
    """
    rewards = [None if r is None else float(r) for r in env_reward]
    log_metric = kwargs.get("log_metric")
    if callable(log_metric) and rewards:
        turns = kwargs.get("num_turns") or []
        if turns:
            log_metric("env/num_turns", sum(turns) / len(turns))
        truncated = kwargs.get("truncated") or []
        if truncated:
            log_metric("env/truncated", sum(bool(t) for t in truncated) / len(truncated))
        log_metric("env/failed", sum(r is None for r in rewards) / len(rewards))
    return rewards


# ---- generation backends -------------------------------------------------------------------------

Generate = Callable[[list[list[int] | None], list[int]], list[tuple[list[int], list[float | None]] | None]]
"""``generate(prompts, budgets)``: for each prompt (token ids, or None for a row that has
ended), the sampled token ids and their log-probs (None where the prompt was None). May return
more tokens than the row's budget or past an end-of-turn token; the rollout cuts them."""


def _tokenizer_of(trainer: Any) -> Any:
    processing_class = trainer.processing_class
    return getattr(processing_class, "tokenizer", processing_class)


def _eos_ids(trainer: Any, tokenizer: Any) -> list[int]:
    ids = getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id]
    return [int(i) for i in ids if i is not None]


def _hf_generate(trainer: Any) -> Generate:
    """Generation with the training model itself (``use_vllm=False``), as TRL's own HF path does it."""
    from transformers import GenerationConfig
    from trl.models import unwrap_model_for_generation

    args = trainer.args
    tokenizer = _tokenizer_of(trainer)
    base = getattr(trainer, "generation_config", None)
    if base is None:
        base = GenerationConfig(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                                eos_token_id=_eos_ids(trainer, tokenizer), pad_token_id=tokenizer.pad_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else _eos_ids(trainer, tokenizer)[0]
    device = trainer.accelerator.device

    def generate(prompts: list[list[int] | None], budgets: list[int]) -> list[tuple[list[int], list[float]] | None]:
        live = [i for i, p in enumerate(prompts) if p is not None]
        results: list[tuple[list[int], list[float]] | None] = [None] * len(prompts)
        config = copy.deepcopy(base)
        config.max_new_tokens = max([budgets[i] for i in live], default=1)
        config.output_scores = True
        config.return_dict_in_generate = True
        width = max((len(prompts[i]) for i in live), default=0)
        input_ids = torch.full((len(live), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(live), width), dtype=torch.long)
        for row, i in enumerate(live):
            input_ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            attention[row, width - len(prompts[i]):] = 1
        # Every rank enters the unwrap context on every turn (a collective under DeepSpeed ZeRO-3), even with
        # nothing to generate, so the ranks stay in step.
        with unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator,
            gather_deepspeed3_params=getattr(args, "ds3_gather_for_generation", True),
            generation_kwargs=getattr(trainer, "generation_kwargs", None),
            gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs", None),
        ) as model, torch.no_grad():
            if not live:
                return results
            out = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                 generation_config=config)
        sampled = out.sequences[:, width:]
        # Scores are the processed logits (temperature, top-p/top-k applied): log-softmax gives the
        # log-probability under the distribution each token was sampled from.
        logprobs = torch.stack([
            torch.log_softmax(step.float(), dim=-1).gather(1, sampled[:, t:t + 1]).squeeze(1)
            for t, step in enumerate(out.scores)
        ], dim=1) if out.scores else torch.zeros_like(sampled, dtype=torch.float)
        for row, i in enumerate(live):
            results[i] = (sampled[row].tolist(), logprobs[row].tolist())
        return results

    return generate


def _vllm_generate(trainer: Any) -> Generate:
    """Generation through TRL's vLLM (colocate or server), one completion per prompt.

    ``trainer.vllm_generation.generate(..., num_generations=1)`` runs token prompts through the
    colocated ``LLM`` or, in server mode, gathers every rank's prompts to the main process, asks
    the vLLM server and scatters the results back. Server mode and colocate with tensor
    parallelism are collectives that slice results by ``len(prompts)``: every rank sends one
    prompt per row, a one-token placeholder for rows that have ended.
    """
    vllm = trainer.vllm_generation
    tokenizer = _tokenizer_of(trainer)
    collective = vllm.mode == "server" or getattr(vllm, "tensor_parallel_size", 1) > 1
    placeholder = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else _eos_ids(trainer, tokenizer)[0]]

    def generate(prompts: list[list[int] | None], budgets: list[int]) -> list[tuple[list[int], list[float | None]] | None]:
        sent = list(range(len(prompts))) if collective else [i for i, p in enumerate(prompts) if p is not None]
        results: list[tuple[list[int], list[float | None]] | None] = [None] * len(prompts)
        if not sent:
            return results
        batch = [prompts[i] if prompts[i] is not None else placeholder for i in sent]
        _, completion_ids, logprobs, _ = vllm.generate(prompts=batch, images=None, num_generations=1)
        for n, i in enumerate(sent):
            if prompts[i] is None:
                continue
            ids = list(completion_ids[n])
            lps = [lp[0] for lp in logprobs[n]] if logprobs is not None else [None] * len(ids)
            results[i] = (ids, lps)
        return results

    return generate


def trainer_generate(trainer: Any) -> Generate:
    """The trainer's own generation: vLLM when ``use_vllm``, else the training model with HF ``generate``."""
    if getattr(trainer, "use_vllm", False):
        return _vllm_generate(trainer)
    return _hf_generate(trainer)


def _any_live(trainer: Any) -> Callable[[int], bool]:
    """``any_live(n_local)``: whether any rank still has a live episode (an all-reduce when distributed).

    Called once per turn on every rank, so every rank runs the same number of turns.
    """
    accelerator = trainer.accelerator
    if accelerator.num_processes <= 1:
        return lambda n: n > 0

    def any_live(n: int) -> bool:
        counts = accelerator.gather(torch.tensor([n], device=accelerator.device))
        return bool(counts.sum().item() > 0)

    return any_live


# ---- rollout -------------------------------------------------------------------------------------


@dataclass
class _Row:
    """One rollout row: its episode and its tokens."""

    episode: Episode
    prompt_ids: list[int]
    tools: list[dict[str, Any]] | None
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


async def _finish(episode: Episode) -> None:
    """Verify an episode now: one empty assistant turn ends it (so ``/verify`` sees the trajectory so far)."""
    await episode.play(normalize_action([{"role": "assistant", "content": ""}], turn=episode.turn))


class NemoGymRollout:
    """A TRL ``rollout_func``: multi-turn episodes of one environment, token-exact.

    Build it with :func:`nemo_gym_rollout_func`. Calling it as ``rollout(prompts, trainer)``
    plays one episode per prompt, all of them concurrently on the background loop, with the
    trainer's own generation (see :func:`trainer_generate`), and returns the columns TRL needs
    (module docstring). The env (and its embedded server, when no ``base_url`` is given) starts
    at the first call and lives until :meth:`close`.

    Args:
        env_id: A registered id (``"NemoGym/<server>-v0"`` or ``"NemoGym/Generic-v0"``).
        max_turns: Model turns per episode; the env verifies at this limit (``truncated``).
        max_turn_tokens: Cap on the tokens of one model turn (default: what is left of
            ``max_completion_length``).
        **env_kwargs: Passed to ``gym.make`` (``base_url``, ``dataset``, ``config_paths``,
            ``request_timeout_s``...).

    Attributes:
        last_rows: The rows of the last call (episodes, tokens), for inspection.
    """

    def __init__(self, env_id: str, *, max_turns: int = 6, max_turn_tokens: int | None = None, **env_kwargs: Any):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_turn_tokens is not None and max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
        self.env_id = env_id
        self.max_turns = max_turns
        self.max_turn_tokens = max_turn_tokens
        self.env_kwargs = env_kwargs
        self._env: Any = None
        self._tasks: _TaskTable | None = None
        self._renderers: dict[int, _Renderer] = {}
        self._lock = threading.Lock()
        self.last_rows: list[_Row] = []

    def __repr__(self) -> str:
        return f"NemoGymRollout({self.env_id!r}, max_turns={self.max_turns})"

    @property
    def env(self) -> Any:
        """The underlying :class:`~nemo_gym_env.envs.env.NemoGymEnv` (made, and its server started, on first use)."""
        with self._lock:
            if self._env is None:
                self._env = gym.make(self.env_id, max_steps=self.max_turns, **self.env_kwargs).unwrapped
                self._tasks = _TaskTable(self._env.rows)
            return self._env

    def close(self) -> None:
        """Close the env (stopping its embedded server when no other user holds it); safe to call twice."""
        with self._lock:
            if self._env is not None:
                self._env.close()
                self._env = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """The ``rollout_func`` entry point: ``len(prompts)`` rows generated by ``trainer``'s own model."""
        tokenizer = _tokenizer_of(trainer)
        max_length = getattr(trainer, "max_completion_length", None) or trainer.args.max_completion_length
        return self.rollout(prompts, trainer_generate(trainer), tokenizer=tokenizer, max_completion_length=max_length,
                            eos_token_ids=_eos_ids(trainer, tokenizer), any_live=_any_live(trainer))

    def rollout(self, prompts: list[Any], generate: Generate, *, tokenizer: Any, max_completion_length: int,
                eos_token_ids: Sequence[int] | None = None, any_live: Callable[[int], bool] | None = None) -> dict[str, list]:
        """Play one episode per prompt with ``generate`` and return TRL's rollout columns.

        Args:
            prompts: Conversational prompts from :func:`tasks_dataset` (one per row; repeats play the same task).
            generate: See :data:`Generate`.
            tokenizer: Renders prompts and tool outputs (its chat template) and decodes model text.
            max_completion_length: Token budget of a whole episode's completion (model and
                environment tokens); an episode that would exceed it ends, verified and ``truncated``.
            eos_token_ids: End-of-turn tokens (default: the tokenizer's EOS).
            any_live: Turn barrier (see ``_any_live``); default: local.
        """
        env = self.env
        renderer = self._renderer(tokenizer)
        eos = set(eos_token_ids or [tokenizer.eos_token_id])
        any_live = any_live or (lambda n: n > 0)
        loop = background_loop()

        rows = [self._new_row(prompt, env, renderer, tokenizer) for prompt in prompts]
        loop.run(self._start_all(rows))
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
        columns = self._columns(rows, tokenizer, eos)
        failed = [error for error in columns["env_error"] if error is not None]
        if failed:
            log.warning("%s: %d of %d episodes failed and are masked out (first: %s)", self.env_id, len(failed),
                        len(rows), failed[0])
        return columns

    # ---- internals -------------------------------------------------------------------------

    def _renderer(self, tokenizer: Any) -> _Renderer:
        renderer = self._renderers.get(id(tokenizer))
        if renderer is None or renderer.tokenizer is not tokenizer:
            renderer = _Renderer(tokenizer)
            try:
                renderer.continuation([{"role": "user", "content": "x"}], None, None)
            except _NoContinuation as exc:
                raise ValueError(
                    f"{exc}: multi-turn rollouts need a chat template that renders later turns as a suffix of "
                    "earlier ones (prefix-preserving); set tokenizer.chat_template to one (e.g. TRL's "
                    "trl.chat_template_utils.get_training_chat_template(tokenizer))"
                ) from None
            self._renderers = {id(tokenizer): renderer}
        return renderer

    def _new_row(self, prompt: Any, env: Any, renderer: _Renderer, tokenizer: Any) -> _Row:
        assert self._tasks is not None
        row, index = self._tasks.find(prompt)
        params = row["responses_create_params"]
        chat_tools = tools_to_chat(params.get("tools"))
        template_tools = renderer.template_tools(chat_tools)
        items = input_items(row)
        if params.get("instructions"):
            items.insert(0, {"type": "message", "role": "system", "content": params["instructions"]})
        messages = renderer.messages(items, [], chat_tools)
        text = renderer.render(messages, template_tools, True)
        prompt_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return _Row(Episode(env.client, row, index, self.max_turns), prompt_ids, template_tools)

    def _budget(self, row: _Row, max_completion_length: int) -> int:
        left = max_completion_length - len(row.completion_ids)
        return max(1, min(left, self.max_turn_tokens or left))

    async def _start_all(self, rows: list[_Row]) -> None:
        async def start(row: _Row) -> None:
            try:
                await row.episode.start()
            except ServerError as exc:
                row.fail(str(exc))

        await asyncio.gather(*(start(row) for row in rows))

    async def _play_all(self, rows: list[_Row], texts: list[str]) -> list[Any]:
        return await asyncio.gather(*(row.episode.play(normalize_action(text, turn=row.episode.turn))
                                      for row, text in zip(rows, texts)))

    async def _finish_all(self, rows: list[_Row]) -> None:
        await asyncio.gather(*(_finish(row.episode) for row in rows))
        for row in rows:
            row.truncated = True
            if row.episode.error is not None:
                row.fail(str(row.episode.error))

    def _after_turn(self, row: _Row, result: Any, generated_end: str | None, renderer: _Renderer, tokenizer: Any,
                    max_completion_length: int, ending: list[_Row]) -> None:
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

    def _columns(self, rows: list[_Row], tokenizer: Any, eos: set[int]) -> dict[str, list]:
        filler = min(eos)
        columns: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                     "env_reward", "num_turns", "truncated", "env_error")}
        metrics: list[dict[str, float]] = []
        for row in rows:
            completion, logprobs, mask = row.completion_ids, row.logprobs, row.env_mask
            verify = row.episode.last_verify if row.error is None else None
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
            task_keys = set(row.episode.task)
            metrics.append({} if verify is None else {
                k: v for k, v in numeric_fields(verify).items() if k != "reward" and k not in task_keys})
        for name in sorted({k for m in metrics for k in m}):
            column = name if name not in _RESERVED_FIELDS else f"verify_{name}"
            columns[column] = [m.get(name) for m in metrics]
        return columns


def nemo_gym_rollout_func(env_id: str, *, max_turns: int = 6, max_turn_tokens: int | None = None,
                          **env_kwargs: Any) -> NemoGymRollout:
    """A TRL ``rollout_func`` playing ``env_id``'s episodes; see :class:`NemoGymRollout`.

    Example (a bundled server, started on first use)::

        rollout = nemo_gym_rollout_func("NemoGym/example_multi_step-v0", max_turns=6)
        GRPOTrainer(..., reward_funcs=[env_reward], rollout_func=rollout)
    """
    return NemoGymRollout(env_id, max_turns=max_turns, max_turn_tokens=max_turn_tokens, **env_kwargs)


# ---- environment_factory -------------------------------------------------------------------------

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict}
_NO_TURN_LIMIT = 1 << 30


def _annotation(schema: dict[str, Any]) -> Any:
    """A Python type hint for a JSON schema, one ``transformers.get_json_schema`` turns back into it."""
    if isinstance(schema.get("enum"), list) and schema["enum"] and all(isinstance(v, (str, int)) for v in schema["enum"]):
        return Literal[tuple(schema["enum"])]
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        hint = _annotation({**schema, "type": kinds[0]}) if len(kinds) == 1 else str
        return hint | None if "null" in kind else hint
    if kind == "array":
        items = schema.get("items")
        return list[_annotation(items)] if isinstance(items, dict) and items.get("type") else list
    return _JSON_TYPES.get(kind, str)


def _one_line(text: Any) -> str:
    return re.sub(r"\s+", " ", str(text or "")).strip()


def _python_name(name: str) -> str:
    """A Python identifier for a tool name (the model calls the method by this name)."""
    ident = re.sub(r"\W", "_", name)
    if not ident or ident[0].isdigit():
        ident = f"tool_{ident}"
    if keyword.iskeyword(ident):
        ident += "_"
    return ident


def _tool_method(route: str, tool: dict[str, Any]) -> Callable[..., str]:
    """A method ``name(self, **arguments) -> str`` with the tool's typed signature and a Google docstring."""
    parameters = tool.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    arg_lines = []
    for name, schema in properties.items():
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"tool {route!r}: parameter {name!r} is not a Python identifier; use the rollout_func route")
        hint = _annotation(schema if isinstance(schema, dict) else {})
        if name in required:
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hint))
        else:
            hint = hint | None
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=hint))
        annotations[name] = hint
        description = _one_line((schema or {}).get("description")) or name.replace("_", " ")
        if isinstance(schema, dict) and isinstance(schema.get("enum"), list):
            description += f" (choices: {json.dumps(schema['enum'])})"
        arg_lines.append(f"    {name}: {description}")
    annotations["return"] = str

    def method(self: _ToolEnvironment, **arguments: Any) -> str:
        return self._call(route, {k: v for k, v in arguments.items() if v is not None})

    method.__name__ = method.__qualname__ = _python_name(route)
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    doc = [_one_line(tool.get("description")) or f"Call the {route} tool."]
    if arg_lines:
        doc += ["", "Args:", *arg_lines]
    doc += ["", "Returns:", "    The tool's reply (JSON text)."]
    method.__doc__ = "\n".join(doc)
    return method


class _SharedEnv:
    """One env (and server) shared by every instance of an environment class; made on first use."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any]):
        self.env_id, self.env_kwargs = env_id, env_kwargs
        self._env: Any = None
        self._tasks: _TaskTable | None = None
        self._lock = threading.Lock()

    def get(self) -> tuple[Any, _TaskTable]:
        with self._lock:
            if self._env is None:
                self._env = gym.make(self.env_id, **self.env_kwargs).unwrapped
                self._tasks = _TaskTable(self._env.rows)
            return self._env, self._tasks  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            if self._env is not None:
                self._env.close()
                self._env = None


class _ToolEnvironment:
    """Base of the classes :func:`nemo_gym_environment` builds. Public methods are tools, so keep them so."""

    _shared: _SharedEnv

    def __init__(self) -> None:
        self._episode: Episode | None = None
        self._error: str | None = None
        self._calls = 0

    def reset(self, task: str | int | None = None, prompt: Any = None, **row: Any) -> None:
        """Start an episode on the dataset row's task (``task`` from :func:`tasks_dataset`); returns None."""
        env, tasks = self._shared.get()
        if isinstance(task, str):
            task_row = load_rows([json.loads(task)])[0]
            index = tasks.index_by_row.get(_row_key(task_row))
        elif isinstance(task, int) and not isinstance(task, bool):
            task_row, index = env.rows[task], task
        elif prompt is not None:
            task_row, index = tasks.find(prompt)
        else:
            raise ValueError("reset needs the row's 'task' (build the dataset with tasks_dataset(...)) or its 'prompt'")
        self._episode = Episode(env.client, task_row, index, _NO_TURN_LIMIT)
        self._error, self._calls = None, 0
        try:
            background_loop().run(self._episode.start())
        except ServerError as exc:
            self._error = str(exc)[:1000]

    def get_reward(self) -> float | None:
        """``POST /verify`` with the trajectory so far (the tool calls and their outputs); None if the episode failed."""
        episode = self._episode
        if episode is None or self._error is not None:
            return None
        if not episode.done:
            background_loop().run(_finish(episode))
        if episode.error is not None or episode.last_verify is None:
            self._error = str(episode.error)[:1000]
            return None
        return float(episode.last_verify["reward"])

    def _call(self, route: str, arguments: dict[str, Any]) -> str:
        episode = self._episode
        if episode is None:
            return json.dumps({"error": "the environment was not reset"})
        if self._error is not None or episode.done:
            return json.dumps({"error": self._error or "the episode has ended"})
        self._calls += 1
        item = {"type": "function_call", "name": route, "arguments": json.dumps(arguments, ensure_ascii=False),
                "call_id": f"call_{self._calls}"}
        observation, *_ = background_loop().run(episode.play(normalize_action([item], turn=episode.turn)))
        if episode.error is not None:
            self._error = str(episode.error)[:1000]
            return json.dumps({"error": self._error})
        return observation[0]["output"]


def nemo_gym_environment(env_id: str, **env_kwargs: Any) -> type:
    """A TRL ``environment_factory``: a class whose methods are the server's tools.

    The tools come from the first task row's ``tools`` (name, description and JSON-schema
    parameters become a typed signature and a Google docstring, which
    ``transformers.utils.get_json_schema`` reads back). ``reset(**row)`` starts a session on the
    row's task (its ``task`` column from :func:`tasks_dataset`); each tool method is
    ``POST /<tool>`` with the episode's cookies; ``get_reward()`` is ``POST /verify`` with the
    episode so far. One env, and its embedded server, is shared by all instances and made at the
    first ``reset``; ``close()`` on the class releases it.

    TRL gives the environment the tool calls only, never the model's text, so verifiers that
    read the final answer need the ``rollout_func`` route.

    Example:
        >>> Env = nemo_gym_environment("NemoGym/example_single_tool_call-v0")
        >>> from transformers.utils import get_json_schema
        >>> get_json_schema(Env.get_weather)["function"]["parameters"]["required"]
        ['city']
    """
    rows = env_rows(env_id, **env_kwargs)
    tools = [t for t in rows[0]["responses_create_params"].get("tools") or [] if isinstance(t, dict)]
    namespace: dict[str, Any] = {"_shared": _SharedEnv(env_id, env_kwargs)}
    for tool in tools:
        if tool.get("type", "function") != "function" or not isinstance(tool.get("name"), str):
            raise ValueError(f"{env_id}: tool {tool.get('name') or tool.get('type')!r} is not a function tool")
        method = _tool_method(tool["name"], tool)
        if method.__name__ in namespace or method.__name__ in ("reset", "get_reward", "close") \
                or method.__name__.startswith("_"):
            raise ValueError(f"{env_id}: tool {tool['name']!r} clashes with a method name; use the rollout_func route")
        namespace[method.__name__] = method
    namespace["close"] = classmethod(lambda cls: cls._shared.close())
    name = "".join(part.capitalize() for part in re.split(r"\W+", env_id.split("/")[-1].rsplit("-v", 1)[0]) if part)
    namespace["__doc__"] = f"Tools of {env_id}, one episode per reset (built by nemo_gym_environment)."
    namespace["__module__"] = __name__
    return type(f"{name}Environment", (_ToolEnvironment,), namespace)
