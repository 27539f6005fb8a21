"""One episode against a resources server: the state and steps shared by the env and the vector env."""

from __future__ import annotations

import json
import logging
import uuid
from collections import OrderedDict
from typing import Any

from nemo_gym_env.client.resources import CookieJar, ResourcesClient
from nemo_gym_env.errors import ServerError, VerifyFailed
from nemo_gym_env.protocol.dataset import input_items
from nemo_gym_env.protocol.failures import verdict_failure
from nemo_gym_env.protocol.items import content_text, plain
from nemo_gym_env.protocol.keys import STEP_REWARD_SUM_KEY, STEP_REWARDS_KEY, VERIFY_REWARD_KEY
from nemo_gym_env.protocol.metrics import numeric_fields
from nemo_gym_env.protocol.outcomes import TOOL_CALL_ERRORS_KEY
from nemo_gym_env.protocol.parser import tool_call_problem
from nemo_gym_env.protocol.types import RESERVED_ROUTES, TOOL_NAME_RE, Response, make_response

__all__ = ["EPISODE_REWARDS", "SAMPLING_KEYS", "Episode", "StepResult", "tool_names", "unknown_tool_message",
           "verdict_info"]

log = logging.getLogger(__name__)

SAMPLING_KEYS = ("temperature", "top_p", "max_output_tokens", "max_tool_calls", "parallel_tool_calls",
                 "tool_choice", "instructions")

StepResult = tuple[list, float, bool, bool, dict]

EPISODE_REWARDS = ("verify", "sum")
"""What an episode's reward is: the ``/verify`` reward (default), or its sum with every step reward."""

_MAX_TOOL_CALL_ERRORS = 20  # kept in a row: enough to see what went wrong, bounded whatever the model does


def tool_names(tools: list[Any]) -> list[str]:
    """The function names among tool schemas (Responses ``{"type": "function", "name"}`` or Chat's nested form).

    Example:
        >>> tool_names([{"type": "function", "name": "a"}, {"type": "function", "function": {"name": "b"}}])
        ['a', 'b']
    """
    names = []
    for tool in map(plain, tools):
        if not isinstance(tool, dict):
            continue
        nested = tool.get("function")
        name = tool.get("name") or (nested.get("name") if isinstance(nested, dict) else None)
        if isinstance(name, str) and name:
            names.append(name)
    return names


def unknown_tool_message(name: str, tools: list[str]) -> str:
    """The one message the model reads for a tool this environment does not have, naming the ones it has.

    Example:
        >>> unknown_tool_message("nosuch", ["get_weather"])
        "Unknown tool 'nosuch': not a tool of this environment; its tools are: get_weather"
    """
    has = f"its tools are: {', '.join(tools)}" if tools else "the task offers no tools"
    return f"Unknown tool {name[:100]!r}: not a tool of this environment; {has}"


_TOOLS_CACHE: OrderedDict[str, list[Any]] = OrderedDict()
_TOOLS_CACHE_SIZE = 1024


def _dumped_tools(tools: list[Any]) -> list[Any]:
    """``make_response([], tools=tools)``'s tools as JSON, cached by the tools' JSON text.

    The result is shared between episodes: serialise it, never mutate it.
    """
    key = json.dumps(tools, sort_keys=True, default=repr)
    dumped = _TOOLS_CACHE.get(key)
    if dumped is None:
        dumped = make_response([], tools=tools).model_dump(mode="json", exclude_none=True, by_alias=True)["tools"]
        _TOOLS_CACHE[key] = dumped
        if len(_TOOLS_CACHE) > _TOOLS_CACHE_SIZE:
            _TOOLS_CACHE.popitem(last=False)
    else:
        _TOOLS_CACHE.move_to_end(key)
    return dumped


def verdict_info(reply: dict[str, Any], info: dict[str, Any]) -> None:
    """The parts of a verdict every episode's last ``info`` carries besides the numbers.

    ``mask_sample`` (an infrastructure failure: train on nothing of it, score it nothing), the
    reason of a failure, and ``reward_components`` (a name -> number map; the client checked it).
    """
    for key in ("failure_kind", "failure_reason"):
        if isinstance(reply.get(key), str):
            info[key] = reply[key][:500]
    if isinstance(reply.get("mask_sample"), bool):
        info["mask_sample"] = reply["mask_sample"]
    if isinstance(reply.get("reward_components"), dict):
        info["reward_components"] = {str(k): float(v) for k, v in reply["reward_components"].items()}


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON, whatever Python's json module accepts.
    raise ValueError(f"{name} is not a JSON value")


class Episode:
    """A task row, its session cookies and its trajectory; async, runs on the background loop.

    ``start`` seeds the session; ``play`` sends one model turn's tool calls in order and
    verifies when the turn has no tool call or ``max_steps`` is reached; ``finish`` verifies
    the episode as it stands. Server failures do not raise: they end the episode truncated,
    with ``error`` set and ``info["error"]``. So does a ``/verify`` reply that judges nothing (an
    infrastructure or task-row failure, :mod:`~nemo_gym_env.protocol.failures`): ``error`` is a
    :class:`~nemo_gym_env.errors.VerifyFailed`, the step's reward 0.0 and ``info["mask_sample"]`` true.

    Step rewards: a tool reply may carry a step reward (the
    :data:`~nemo_gym_env.protocol.keys.STEP_REWARD_HEADER` header); a turn's step reward is the
    sum of its calls' and is the reward ``play`` returns; the last turn returns it plus the
    ``/verify`` reward. :attr:`step_rewards` keeps one per model turn. The episode's reward
    (``info["reward"]`` at the end, :meth:`verdict`) is the ``/verify`` reward, or with
    ``episode_reward="sum"`` the ``/verify`` reward plus every step reward.

    Example:
        >>> episode = Episode(ResourcesClient("http://127.0.0.1:8000"), row, 0, max_steps=8)  # doctest: +SKIP
        >>> observation, info = await episode.start()                                          # doctest: +SKIP
        >>> observation, reward, terminated, truncated, info = await episode.play(items)        # doctest: +SKIP
    """

    def __init__(self, client: ResourcesClient, row: dict[str, Any], task_index: int | None, max_steps: int, *,
                 close_session: bool = False, episode_reward: str = "verify"):
        if episode_reward not in EPISODE_REWARDS:
            raise ValueError(f"episode_reward must be one of {EPISODE_REWARDS}, got {episode_reward!r}")
        self.episode_reward = episode_reward
        self.step_rewards: list[float] = []
        """One step reward per model turn (0.0 for a turn whose tools gave none)."""
        self.gave_step_rewards = False
        """Whether any tool reply of the episode carried a step reward."""
        self.client = client
        self.task = row
        self.task_index = task_index
        self.max_steps = max_steps
        self.close_session = close_session
        self.cookies: CookieJar = {}
        self.trajectory: list[dict[str, Any]] = []
        self.turn = 0
        self.done = True
        self.last_verify: dict[str, Any] | None = None
        self.error: ServerError | None = None
        self.usage: dict[str, int] | None = None
        """Token counts summed by :meth:`add_usage`; None until it is called (the response then has no usage)."""
        self.tool_call_errors: list[str] = []
        """Every tool call the environment could not run (the first few): an unknown tool, arguments
        that are not JSON, a ``<tool_call>`` block that is not one. The row keeps them
        (:data:`~nemo_gym_env.protocol.outcomes.TOOL_CALL_ERRORS_KEY`)."""

    @property
    def tools(self) -> list[Any]:
        """The row's tool schemas."""
        return list(self.task["responses_create_params"].get("tools") or [])

    @property
    def response(self) -> Response:
        """The episode so far as a ``Response`` (every model and tool item, and the usage when counted)."""
        return make_response(self.trajectory, tools=self.tools, **self._usage_field())

    def add_usage(self, input_tokens: int, output_tokens: int) -> None:
        """Count one model call's tokens; the verify body's ``response.usage`` holds the episode's sums.

        Raises:
            ValueError: a count is negative or not an integer.
        """
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        usage = self.usage or {"input_tokens": 0, "output_tokens": 0}
        self.usage = {"input_tokens": usage["input_tokens"] + input_tokens,
                      "output_tokens": usage["output_tokens"] + output_tokens}

    def _usage_field(self) -> dict[str, Any]:
        if self.usage is None:
            return {}
        return {"usage": {**self.usage, "total_tokens": self.usage["input_tokens"] + self.usage["output_tokens"],
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}

    async def start(self) -> tuple[list, dict]:
        """``POST /seed_session`` with the row; the observation is the row's input items.

        Raises:
            ServerError: when the server cannot seed the session.
        """
        await self.client.seed_session(self.task, self.cookies, task_index=self.task_index)
        self.done = False
        return input_items(self.task), self.start_info()

    def start_info(self) -> dict[str, Any]:
        """``info`` of a reset: the task index, its tools and its sampling parameters."""
        params = self.task["responses_create_params"]
        return {
            "task_index": -1 if self.task_index is None else self.task_index,
            "tools": self.tools,
            "sampling": {k: params[k] for k in SAMPLING_KEYS if params.get(k) is not None},
        }

    async def play(self, items: list[dict[str, Any]]) -> StepResult:
        """One model turn of already normalised output items."""
        self.trajectory.extend(items)
        self.turn += 1
        calls = [item for item in items if item["type"] == "function_call"]
        observation: list[dict[str, Any]] = []
        info: dict[str, Any] = {"turn": self.turn, "num_tool_calls": len(calls)}
        step_reward = 0.0
        errors_before = len(self.tool_call_errors)
        if not calls:  # a final answer; one that holds a <tool_call> the parser could not read says why
            self._malformed_call(items)
        try:
            for call in calls:
                output, reward = await self._call_tool(call)
                if reward is not None:
                    step_reward += reward
                    self.gave_step_rewards = True
                # FunctionCallOutput(...).model_dump(exclude_none=True), without building the model.
                item = {"call_id": call["call_id"], "output": output, "type": "function_call_output"}
                self.trajectory.append(item)
                observation.append(item)
        except ServerError as exc:
            return self._fail(exc, observation, info)
        self.step_rewards.append(step_reward)
        if len(self.tool_call_errors) > errors_before:
            info["tool_call_error"] = self.tool_call_errors[-1][:500]
        if self.gave_step_rewards:
            info["step_reward"] = step_reward
        if calls and self.turn < self.max_steps:
            return observation, step_reward, False, False, info
        try:
            reward = await self._verify(info)
        except ServerError as exc:
            return self._fail(exc, observation, info)
        self.done = True
        return observation, reward + step_reward, not calls, bool(calls), info

    async def finish(self) -> StepResult:
        """End the episode now: ``POST /verify`` with the trajectory so far, ``truncated``.

        For callers that stop an episode before the model does (a token budget ran out, a
        trainer's turn limit): the verifier scores what happened, and no model turn is made up.

        Raises:
            RuntimeError: the episode has ended, or was never started.
        """
        if self.done:
            raise RuntimeError("the episode has ended (or never started): nothing to finish")
        info: dict[str, Any] = {"turn": self.turn, "num_tool_calls": 0}
        try:
            reward = await self._verify(info)
        except ServerError as exc:
            return self._fail(exc, [], info)
        self.done = True
        return [], reward, False, True, info

    async def _call_tool(self, call: dict[str, Any]) -> tuple[str, float | None]:
        name = call["name"]
        offered = tool_names(self.tools)
        if not TOOL_NAME_RE.match(name) or name in RESERVED_ROUTES or (offered and name not in offered):
            return self._tool_call_error(unknown_tool_message(name, offered)), None
        arguments = call["arguments"]
        try:  # only checked: the server gets the arguments exactly as the model wrote them
            json.loads(arguments, parse_constant=_no_constant)
        except (TypeError, ValueError) as exc:
            return self._tool_call_error(f"Invalid tool call arguments: {exc}"), None
        reply = await self.client.call_tool_reply(name, arguments, self.cookies, task_index=self.task_index)
        if not reply.found:  # a task that lists no tools, and a name the server has no route for
            return self._tool_call_error(unknown_tool_message(name, offered)), None
        return reply.output, reply.step_reward

    def _tool_call_error(self, message: str) -> str:
        """Record a tool call the environment could not run; the error output the model reads."""
        if len(self.tool_call_errors) < _MAX_TOOL_CALL_ERRORS:
            self.tool_call_errors.append(message[:500])
        return json.dumps({"error": message})

    def _malformed_call(self, items: list[dict[str, Any]]) -> None:
        """Record why a final answer's ``<tool_call>`` text is no tool call (it ends the episode as an answer)."""
        for item in items:
            if item.get("type", "message") == "message" and item.get("role", "assistant") == "assistant":
                problem = tool_call_problem(content_text(item.get("content")))
                if problem is not None:
                    self._tool_call_error(f"Malformed tool call, taken as the final answer: {problem}")
                    return

    async def _verify(self, info: dict[str, Any]) -> float:
        body = {**self.task, "response": self._response_json()}
        reply = await self.client.verify(body, self.cookies, task_index=self.task_index)
        self.last_verify = reply
        failure = verdict_failure(reply)
        if failure is not None:  # no judgement of the model: no reward, the episode fails (truncated)
            verdict_info(reply, info)
            info["mask_sample"] = True
            if self.close_session:
                await self._close_session()
            raise VerifyFailed(failure[1], server=self.client.base_url, route="/verify", kind=failure[0],
                               reply=reply, task_index=self.task_index)
        reward = float(reply["reward"])
        info.update({k: v for k, v in numeric_fields(reply).items() if k != "reward"})
        info["reward"] = reward
        verdict_info(reply, info)
        if self.tool_call_errors:
            info["num_tool_call_errors"] = len(self.tool_call_errors)
        if self.gave_step_rewards or self.episode_reward == "sum":
            info[STEP_REWARDS_KEY] = list(self.step_rewards)
            info[STEP_REWARD_SUM_KEY] = float(sum(self.step_rewards))
            if self.episode_reward == "sum":
                info[VERIFY_REWARD_KEY] = reward
                info["reward"] = reward + info[STEP_REWARD_SUM_KEY]
        if self.close_session:
            await self._close_session()
        return reward

    def verdict(self) -> dict[str, Any] | None:
        """The episode's result as a rollout row holds it: the ``/verify`` reply, plus the tool calls
        the environment could not run (:data:`TOOL_CALL_ERRORS_KEY`, when any), plus, when the
        server gave step rewards (or ``episode_reward="sum"``), :data:`STEP_REWARDS_KEY` and
        :data:`STEP_REWARD_SUM_KEY` (and with ``episode_reward="sum"``, ``reward`` their sum with
        the ``/verify`` reward, which :data:`VERIFY_REWARD_KEY` keeps). None before the episode
        is verified."""
        if self.last_verify is None:
            return None
        row = dict(self.last_verify)
        if self.tool_call_errors:
            row[TOOL_CALL_ERRORS_KEY] = list(self.tool_call_errors)
        if self.gave_step_rewards or self.episode_reward == "sum":
            row[STEP_REWARDS_KEY] = list(self.step_rewards)
            row[STEP_REWARD_SUM_KEY] = float(sum(self.step_rewards))
            if self.episode_reward == "sum":
                row[VERIFY_REWARD_KEY] = float(row["reward"])
                row["reward"] = float(row["reward"]) + row[STEP_REWARD_SUM_KEY]
        return row

    async def _close_session(self) -> None:
        """NeMo Gym 0.7's ``POST /close_session``: frees the session on servers that keep it past /verify.

        Its failure never fails the episode: the reward is in hand; it is logged.
        """
        episode_id = uuid.uuid4().hex
        body = {"resources_session_id": episode_id, "episode_id": {"rollout_id": episode_id, "attempt": 0}}
        try:
            reply = await self.client.post_raw("/close_session", body, self.cookies, task_index=self.task_index)
        except ServerError as exc:
            log.warning("%s", exc)
            return
        if not reply.is_success:
            log.warning("%s/close_session (task %s): HTTP %d: %s", self.client.base_url, self.task_index,
                        reply.status_code, reply.text[:200])

    def _response_json(self) -> dict[str, Any]:
        """``self.response`` as JSON, with the task's tools dumped once per task rather than per episode.

        The tool schemas are most of the work of validating a ``Response`` and never change
        within a task; the trajectory is validated every time.
        """
        response = make_response(self.trajectory, **self._usage_field()).model_dump(
            mode="json", exclude_none=True, by_alias=True)
        response["tools"] = _dumped_tools(self.task["responses_create_params"].get("tools") or [])
        return response

    def _fail(self, exc: ServerError, observation: list, info: dict[str, Any]) -> StepResult:
        self.done = True
        self.error = exc
        info.update({"error": str(exc)[:1000], "server": exc.server, "route": exc.route})
        return observation, 0.0, False, True, info
