"""The ``environment_factory`` route: a class whose methods are a server's tools; TRL runs the tool loop.

The tools come from the first task row's ``tools``: each becomes a method with a typed
signature and a Google docstring built from its JSON schema, which
``transformers.utils.get_json_schema`` reads back into the same schema. TRL hands the
environment the tool calls only, never the model's text, so verifiers that read the final
answer need the ``rollout_func`` route (:mod:`nemo_gym_env.adapters.trl.rollout`).
"""

from __future__ import annotations

import inspect
import json
import keyword
import re
from collections.abc import Callable
from typing import Any, Literal

from nemo_gym_env.adapters.trl.tasks import SharedEnv, env_rows
from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.envs.actions import normalize_action
from nemo_gym_env.envs.episode import Episode
from nemo_gym_env.envs.gymnasium_episode import GymnasiumEpisode
from nemo_gym_env.errors import ServerError

__all__ = ["nemo_gym_environment"]

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


class _ToolEnvironment:
    """Base of the classes :func:`nemo_gym_environment` builds. Public methods are tools, so keep them so."""

    _shared: SharedEnv

    def __init__(self) -> None:
        self._episode: Episode | None = None
        self._error: str | None = None
        self._calls = 0

    def reset(self, task: str | int | None = None, prompt: Any = None, **row: Any) -> None:
        """Start an episode on the dataset row's task (``task`` from ``tasks_dataset``); returns None."""
        env, tasks = self._shared.get()
        if isinstance(task, str):
            task_row, index = tasks.task(task)
        elif isinstance(task, int) and not isinstance(task, bool):
            task_row, index = env.rows[task], task
        elif prompt is not None:
            task_row, index = tasks.find(prompt)
        else:
            raise ValueError("reset needs the row's 'task' (build the dataset with tasks_dataset(...)) or its 'prompt'")
        self._episode = env.open_episode(task_row, index, _NO_TURN_LIMIT)
        if isinstance(self._episode, GymnasiumEpisode):
            raise ValueError(f"{env.server_name} speaks the Gymnasium protocol (/reset, /step): it has no tools for "
                             "environment_factory to call; train on it through the rollout_func route")
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


def nemo_gym_environment(env_id: str, **env_kwargs: Any) -> type:
    """A TRL ``environment_factory``: a class whose methods are the server's tools.

    The tools come from the first task row's ``tools`` (name, description and JSON-schema
    parameters become a typed signature and a Google docstring, which
    ``transformers.utils.get_json_schema`` reads back). ``reset(**row)`` starts a session on the
    row's task (its ``task`` column from ``tasks_dataset``); each tool method is
    ``POST /<tool>`` with the episode's cookies; ``get_reward()`` is ``POST /verify`` with the
    episode so far (:meth:`~nemo_gym_env.envs.episode.Episode.finish`: no model turn is made
    up). One env, and its embedded server, is shared by all instances and made at the first
    ``reset``; ``close()`` on the class releases it.

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
    name = "".join(part.capitalize() for part in re.split(r"\W+", env_id.split("/")[-1].rsplit("-v", 1)[0]) if part)
    namespace["__doc__"] = f"Tools of {env_id}, one episode per reset (built by nemo_gym_environment)."
    namespace["__module__"] = __name__
    return type(f"{name}Environment", (_ToolEnvironment,), namespace)
