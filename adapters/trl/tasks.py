"""Task rows for TRL: the training dataset, and finding the task row behind a prompt.

TRL's ``rollout_func`` receives the prompts only, not the other dataset columns, so
:func:`tasks_dataset` carries each task row (JSON) inside its prompt's first message under
:data:`TASK_ROW_FIELD`, a key chat templates ignore; :class:`TaskTable` reads it back (or, for a
prompt built some other way, finds the one task row with the same messages).
:class:`SharedEnv` is the env both TRL routes play on, made on first use.

Example:
    >>> ds = tasks_dataset("NemoGym/example_single_tool_call-v0")
    >>> TaskTable(env_rows("example_single_tool_call")).find(ds[0]["prompt"])[1]
    0
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers
from nemo_gym_env.protocol.dataset import input_items, load_rows
from nemo_gym_env.protocol.items import content_text
from nemo_gym_env.protocol.parser import items_to_text

if TYPE_CHECKING:
    from datasets import Dataset

    from nemo_gym_env.envs.env import NemoGymEnv

__all__ = ["TASK_ROW_FIELD", "SharedEnv", "TaskTable", "chat_messages", "env_rows", "mixture_dataset", "tasks_dataset"]

TASK_ROW_FIELD = "nemo_gym_task"
"""Key of the task row (JSON) on the first message of every prompt :func:`tasks_dataset` writes."""

_CARRIED_CACHE_SIZE = 65536


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


def chat_messages(row: dict[str, Any]) -> list[dict[str, str]]:
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
    the environment built by :func:`~nemo_gym_env.adapters.trl.environment.nemo_gym_environment`
    seeds its session with it) and ``task_index``. ``rollout_func`` only sees the prompts, so the
    first message also carries the row under :data:`TASK_ROW_FIELD`.

    Args:
        source: An env id (``"NemoGym/example_multi_step-v0"``), a bundled server name, a JSONL
            path, or a list of rows.
        **env_kwargs: ``dataset=...`` for env ids without a default dataset (``NemoGym/Generic-v0``).

    Example:
        >>> ds = tasks_dataset("NemoGym/example_single_tool_call-v0")
        >>> ds[0]["prompt"][-1]["role"], json.loads(ds[0]["task"])["responses_create_params"]["tools"][0]["name"]
        ('user', 'get_weather')
    """
    # `datasets` comes with the trl extra and takes seconds to import; only this function needs it.
    from datasets import Dataset

    return Dataset.from_list([_record(row, index) for index, row in enumerate(env_rows(source, **env_kwargs))])


def _record(row: dict[str, Any], index: int) -> dict[str, Any]:
    messages = chat_messages(row)
    task = json.dumps(row, ensure_ascii=False)
    messages = [{**m, TASK_ROW_FIELD: task if n == 0 else None} for n, m in enumerate(messages)]
    return {"prompt": messages, "task": task, "task_index": index}


def mixture_dataset(envs: Mapping[str, Any], num_rows: int | None = None, *, seed: int = 0) -> Dataset:
    """A TRL training dataset of a mixture: :func:`tasks_dataset`'s columns plus ``environment``.

    ``envs`` and the draw are :func:`~nemo_gym_env.envs.mixture.mixture_rows`'s (env id ->
    weight, or -> ``{"weight": w, "base_url": ..., "dataset": ...}``; ``num_rows`` rows, each
    environment's share by weight, in a seeded order). ``environment`` names the row's env id,
    the column TRL's multi-environment ``environment_factory`` routes by: pass
    ``environment_factory=nemo_gym_environments(envs)`` with the same ``envs``. ``task_index``
    is the row's index in its own environment's rows.

    Example:
        >>> ds = mixture_dataset({"NemoGym/example_single_tool_call-v0": 3,
        ...                       "NemoGym/example_session_state_mgmt-v0": 1}, 8)
        >>> sorted(ds["environment"]).count("NemoGym/example_single_tool_call-v0")
        6
    """
    from datasets import Dataset

    from nemo_gym_env.envs.mixture import ENVIRONMENT_KEY, draw_mixture

    return Dataset.from_list([{**_record(row, index), ENVIRONMENT_KEY: entry.env_id}
                              for entry, index, row in draw_mixture(envs, num_rows, seed=seed)])


class TaskTable:
    """Finds the task row of a prompt: the row it carries, or a row of the env with the same messages.

    Args:
        rows: The env's task rows; a row's index here is its task index.
    """

    def __init__(self, rows: Sequence[dict[str, Any]]):
        self.rows = list(rows)
        self._index_by_row = {_row_key(row): i for i, row in enumerate(self.rows)}
        self._by_messages: dict[str, int | None] = {}
        for i, row in enumerate(self.rows):
            key = _messages_key(chat_messages(row))
            self._by_messages[key] = None if key in self._by_messages else i  # None: ambiguous
        self._carried: dict[str, tuple[dict[str, Any], int | None]] = {}

    def task(self, text: str) -> tuple[dict[str, Any], int | None]:
        """``(row, task index)`` of a task row written as JSON (the ``task`` column); the index is
        None for a row that is not one of the env's.

        Raises:
            DatasetError: The row is not a valid task row.
        """
        found = self._carried.get(text)
        if found is None:  # validated once per task, not once per prompt and step
            row = load_rows([json.loads(text)])[0]
            found = self._carried[text] = (row, self._index_by_row.get(_row_key(row)))
            if len(self._carried) > _CARRIED_CACHE_SIZE:
                self._carried.clear()
        return found

    def find(self, prompt: Any) -> tuple[dict[str, Any], int | None]:
        """``(row, task index)`` of a prompt from :func:`tasks_dataset` (or with an env row's messages).

        Raises:
            ValueError: The prompt carries no task and matches no row, or several rows.
        """
        first = prompt[0] if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) else {}
        carried = first.get(TASK_ROW_FIELD)
        if isinstance(carried, str):
            return self.task(carried)
        if isinstance(prompt, list):
            index = self._by_messages.get(_messages_key(prompt), -1)
            if index is not None and index >= 0:
                return self.rows[index], index
            if index is None:
                raise ValueError("two task rows share this prompt; build the dataset with tasks_dataset(...) so "
                                 "each prompt carries its task")
        raise ValueError(f"cannot tell which task this prompt is ({str(prompt)[:200]}); build the training "
                         "dataset with nemo_gym_env.adapters.trl.tasks_dataset(...)")


class SharedEnv:
    """An env made by ``gym.make`` on first use, with the :class:`TaskTable` of its rows; thread-safe.

    Args:
        env_id: A registered id.
        env_kwargs: ``gym.make``'s keyword arguments.
    """

    def __init__(self, env_id: str, env_kwargs: dict[str, Any]):
        self.env_id, self.env_kwargs = env_id, env_kwargs
        self._env: NemoGymEnv | None = None
        self._tasks: TaskTable | None = None
        self._lock = threading.Lock()

    def get(self) -> tuple[NemoGymEnv, TaskTable]:
        """The env (unwrapped; made, and its server started, on the first call) and its task table."""
        with self._lock:
            if self._env is None or self._tasks is None:
                self._env = gym.make(self.env_id, **self.env_kwargs).unwrapped
                self._tasks = TaskTable(self._env.rows)
            return self._env, self._tasks

    def close(self) -> None:
        """Close the env (its embedded server stops when no other user holds it); safe to call twice."""
        with self._lock:
            if self._env is not None:
                self._env.close()
                self._env = None
                self._tasks = None
