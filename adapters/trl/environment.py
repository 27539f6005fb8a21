"""The ``environment_factory`` route: a class whose methods are a server's tools; TRL runs the tool loop.

The tools come from the first task row's ``tools``: each becomes a method with a typed
signature and a Google docstring built from its JSON schema, which
``transformers.utils.get_json_schema`` reads back into the same schema. TRL hands the
environment the tool calls only, never the model's text, so verifiers that read the final
answer need the ``rollout_func`` route (:mod:`nemo_gym_env.adapters.trl.rollout`).
"""

from __future__ import annotations

import copyreg
import inspect
import json
import keyword
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from nemo_gym_env.adapters.trl.tasks import SharedEnv, chat_messages, env_rows
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.episode import Episode
from nemo_gym_env.envs.gymnasium_episode import GymnasiumEpisode
from nemo_gym_env.envs.registration import env_name
from nemo_gym_env.envs.traits import begin_episode
from nemo_gym_env.errors import ServerError

__all__ = ["nemo_gym_environment", "nemo_gym_environments", "verdict_of"]

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


class _EnvironmentClass(type):
    """Metaclass of the classes :func:`nemo_gym_environment` builds: such a class pickles as the
    call that builds it, so it can cross into another process (``AsyncGRPOTrainer`` spawns one)."""


_BUILT: dict[str, type] = {}
_BUILT_LOCK = threading.Lock()


def _build_key(env_id: str, options: dict[str, Any]) -> str:
    return json.dumps([env_id, options], sort_keys=True, default=repr)


def _rebuild(env_id: str, options: dict[str, Any]) -> type:
    """The class of ``nemo_gym_environment(env_id, **options)``: the one this process last built with
    these arguments, so that a class unpickled twice (or in the process that made it) is one object."""
    key = _build_key(env_id, options)
    with _BUILT_LOCK:
        found = _BUILT.get(key)
    return found if found is not None else nemo_gym_environment(env_id, **options)


copyreg.pickle(_EnvironmentClass, lambda cls: (_rebuild, cls._build_args))


def _is_placeholder(prompt: Any) -> bool:
    """TRL's stand-in prompt when there is no dataset (or no ``prompt`` column): one empty user message."""
    return (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], dict)
            and prompt[0].get("role") == "user" and not prompt[0].get("content"))


class _ToolEnvironment:
    """Base of the classes :func:`nemo_gym_environment` builds. Public methods are tools, so keep them so."""

    _shared: SharedEnv
    _build_args: tuple[str, dict[str, Any]]
    _num_generations: int
    _draws: dict[str, Any]

    def __init__(self) -> None:
        self._episode: Episode | None = None
        self._error: str | None = None
        self._calls = 0

    def reset(self, task: str | int | None = None, prompt: Any = None, **row: Any) -> str | None:
        """Start an episode on the dataset row's task (``task`` from ``tasks_dataset``).

        Returns None, or, when the row names no task (TRL's placeholder rows when training has no
        ``train_dataset``), the text of a task the environment draws itself, which TRL appends to
        the empty prompt: the same task for each run of ``num_generations`` resets.
        """
        env, tasks = self._shared.get()
        observation = None
        if isinstance(task, str):
            task_row, index = tasks.task(task)
        elif isinstance(task, int) and not isinstance(task, bool):
            task_row, index = env.rows[task], task
        elif prompt is None or _is_placeholder(prompt):
            index = self._draw(len(env.rows))
            task_row = env.rows[index]
            observation = "\n\n".join(m["content"] for m in chat_messages(task_row) if m["content"])
        else:
            task_row, index = tasks.find(prompt)
        self._episode = env.open_episode(task_row, index, _NO_TURN_LIMIT)
        if isinstance(self._episode, GymnasiumEpisode):
            raise ValueError(f"{env.server_name} speaks the Gymnasium protocol (/reset, /step): it has no tools for "
                             "environment_factory to call; train on it through the rollout_func route")
        self._error, self._calls = None, 0
        try:
            self._episode, _, _ = background_loop().run(begin_episode(self._episode, env.protocol))
        except ServerError as exc:
            self._error = str(exc)[:1000]
        return observation

    @classmethod
    def _draw(cls, num_rows: int) -> int:
        """The task index of the next reset without a task: a new seeded draw every ``num_generations`` resets."""
        draws = cls._draws
        with draws["lock"]:
            if draws["count"] % cls._num_generations == 0:
                draws["index"] = int(draws["rng"].integers(num_rows))
            draws["count"] += 1
            return draws["index"]

    def get_reward(self) -> float | None:
        """``POST /verify`` with the trajectory so far (the tool calls and their outputs); None if the episode failed."""
        episode = self._episode
        if episode is None or self._error is not None:
            return None
        if not episode.done:
            background_loop().run(episode.finish())
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


def verdict_of(environment: Any) -> dict[str, Any] | None:
    """The ``/verify`` reply of an environment's episode (verified now if it was not yet), or None when it failed.

    For reward functions next to the environment's own (TRL hands them ``environments``): the
    verdict's other fields (``looked_up``, ``answered``...) as shaping terms.
    """
    if not isinstance(environment, _ToolEnvironment) or environment.get_reward() is None:
        return None
    episode = environment._episode
    return dict(episode.last_verify) if episode is not None and episode.last_verify is not None else None


def nemo_gym_environment(env_id: str, *, num_generations: int = 1, seed: int | None = 0, **env_kwargs: Any) -> type:
    """A TRL ``environment_factory``: a class whose methods are the server's tools.

    The tools come from the first task row's ``tools`` (name, description and JSON-schema
    parameters become a typed signature and a Google docstring, which
    ``transformers.utils.get_json_schema`` reads back). ``reset(**row)`` starts a session on the
    row's task (its ``task`` column from ``tasks_dataset``); each tool method is
    ``POST /<tool>`` with the episode's cookies; ``get_reward()`` is ``POST /verify`` with the
    episode so far (:meth:`~nemo_gym_env.envs.episode.Episode.finish`: no model turn is made
    up). One env, and its embedded server, is shared by all instances and made at the first
    ``reset``; ``close()`` on the class releases it.

    With no ``train_dataset`` (TRL allows it for a single environment, with ``max_steps``), rows
    carry no task: the environment draws one from its rows (seeded by ``seed``), returns its text
    from ``reset`` (TRL appends it to the empty prompt) and keeps it for ``num_generations``
    resets in a row, as TRL makes them for one group; pass the trainer's ``num_generations``.

    The class pickles as this call (its arguments must pickle), and unpickles in another process
    into a class of its own there: ``AsyncGRPOTrainer`` sends it to a spawned worker.

    TRL gives the environment the tool calls only, never the model's text, so verifiers that
    read the final answer need the ``rollout_func`` route.

    Example:
        >>> Env = nemo_gym_environment("NemoGym/example_single_tool_call-v0")
        >>> from transformers.utils import get_json_schema
        >>> get_json_schema(Env.get_weather)["function"]["parameters"]["required"]
        ['city']
    """
    if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be an int >= 1, got {num_generations!r}")
    rows = env_rows(env_id, **env_kwargs)
    tools = [t for t in rows[0]["responses_create_params"].get("tools") or [] if isinstance(t, dict)]
    namespace: dict[str, Any] = {"_shared": SharedEnv(env_id, env_kwargs)}
    for tool in tools:
        if tool.get("type", "function") != "function" or not isinstance(tool.get("name"), str):
            raise ValueError(f"{env_id}: tool {tool.get('name') or tool.get('type')!r} is not a function tool")
        method = _tool_method(tool["name"], tool)
        if method.__name__ in namespace or method.__name__ in ("reset", "get_reward", "close") \
                or method.__name__.startswith("_"):
            raise ValueError(f"{env_id}: tool {tool['name']!r} clashes with a method name; use the rollout_func route")
        namespace[method.__name__] = method
    namespace["close"] = classmethod(lambda cls: cls._shared.close())
    name = "".join(part.capitalize() for part in re.split(r"\W+", env_name(env_id)) if part)
    namespace["__doc__"] = f"Tools of {env_id}, one episode per reset (built by nemo_gym_environment)."
    namespace["__module__"] = __name__
    namespace["_build_args"] = (env_id, {"num_generations": num_generations, "seed": seed, **env_kwargs})
    namespace["_num_generations"] = num_generations
    namespace["_draws"] = {"lock": threading.Lock(), "count": 0, "index": 0, "rng": np.random.default_rng(seed)}
    cls = _EnvironmentClass(f"{name}Environment", (_ToolEnvironment,), namespace)
    with _BUILT_LOCK:  # unpickled in this process, it is this class again (the latest of equal calls)
        _BUILT[_build_key(*namespace["_build_args"])] = cls
    return cls


def nemo_gym_environments(envs: Mapping[str, Any]) -> dict[str, type]:
    """TRL's multi-environment ``environment_factory``: ``{env id: nemo_gym_environment(env id, ...)}``.

    ``envs`` is a mixture (:func:`~nemo_gym_env.envs.mixture.mixture_entries`: env id -> weight,
    or -> ``{"weight": w, "base_url": ..., "dataset": ...}``); the weights only matter to the
    dataset (:func:`~nemo_gym_env.adapters.trl.tasks.mixture_dataset`), whose ``environment``
    column names these keys. A bundled id plays its server's example rows unless its entry
    gives a ``dataset``, even at a given ``base_url``.

    Example:
        >>> factories = nemo_gym_environments({"NemoGym/example_single_tool_call-v0": 1,
        ...                                    "NemoGym/example_session_state_mgmt-v0": 1})
        >>> sorted(cls.__name__ for cls in factories.values())
        ['Example_session_state_mgmtEnvironment', 'Example_single_tool_callEnvironment']
    """
    from nemo_gym_env.envs.mixture import entry_env_kwargs, mixture_entries

    return {e.env_id: nemo_gym_environment(e.env_id, **entry_env_kwargs(e)) for e in mixture_entries(envs)}
