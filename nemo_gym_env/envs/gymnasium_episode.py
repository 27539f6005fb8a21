"""One episode against a Gymnasium-protocol server (``/reset``, ``/step``), with the Episode interface.

What NeMo Gym's ``gymnasium_agent`` does, as an :class:`~nemo_gym_env.envs.episode.Episode` the
env, the vector env, rollout collection and the trainer adapters can drive:

- ``start``: ``POST /reset`` with the task row; the observation is the row's input items, then
  the server's first observation (when it gives one) as a user message;
- ``play``: ``POST /step`` with the row and the model's turn as a ``Response``; the step's
  ``reward``, ``terminated`` and ``truncated`` are the server's; the next observation is a
  ``function_call_output`` per ``info["tool_outputs"]`` entry, then the server's observation as a
  user message. Reaching ``max_steps`` truncates the episode (the server is not told, as with
  NeMo Gym's agent);
- the episode's verdict (:attr:`last_verify`, what a rollout row holds) is the row, the whole
  trajectory as ``response``, ``reward`` = the sum of the step rewards, ``terminated``,
  ``truncated`` and the last step's ``info``: the row NeMo Gym's agent writes (and, from a
  conversational server, ``user_usage``: the simulated user's tokens, apart from the agent's).

A reply that is not such a step (a reward that is not a finite number, a flag that is missing
or not a boolean) ends the episode truncated with ``info["error"]``, as a failing resources server does.
"""

from __future__ import annotations

import math
from typing import Any

from nemo_gym_env.envs.episode import Episode, StepResult, verdict_info
from nemo_gym_env.errors import ServerError
from nemo_gym_env.protocol.dataset import input_items
from nemo_gym_env.protocol.metrics import numeric_fields

__all__ = ["GymnasiumEpisode"]


class GymnasiumEpisode(Episode):
    """A task row on a Gymnasium-protocol server; see the module docstring.

    Attributes:
        rewards: Every step's reward so far.
        last_step: The last ``/step`` reply.
        prompt: The first observation: the row's input items and the server's first observation.
    """

    def __init__(self, client: Any, row: dict[str, Any], task_index: int | None, max_steps: int):
        super().__init__(client, row, task_index, max_steps)
        self.rewards: list[float] = []
        self.last_step: dict[str, Any] | None = None
        self.prompt: list[dict[str, Any]] = []

    async def start(self) -> tuple[list, dict]:
        """``POST /reset`` with the row; the observation is its input items and the server's first observation.

        Raises:
            ServerError: when the server cannot reset, or answers something that is not a reset.
        """
        reply = await self.client.post_json("/reset", self.task, self.cookies, task_index=self.task_index)
        if not isinstance(reply, dict) or not isinstance(reply.get("observation"), (str, type(None))):
            raise ServerError(f"reset reply is not {{observation: str | null, info}}: {str(reply)[:200]}",
                              server=self.client.base_url, route="/reset", task_index=self.task_index)
        self.done = False
        self.prompt = input_items(self.task) + _said(reply.get("observation"))
        return list(self.prompt), self.start_info()

    async def play(self, items: list[dict[str, Any]]) -> StepResult:
        """One model turn: ``POST /step``; reward and flags are the server's."""
        self.trajectory.extend(items)
        self.turn += 1
        calls = sum(1 for item in items if item["type"] == "function_call")
        info: dict[str, Any] = {"turn": self.turn, "num_tool_calls": calls}
        response = self._turn_response(items)
        try:
            reply = await self.client.post_json("/step", {**self.task, "response": response}, self.cookies,
                                                task_index=self.task_index)
            reward, terminated, truncated, step_info = self._check(reply)
        except ServerError as exc:
            return self._fail(exc, [], info)
        self.last_step = reply
        self.rewards.append(reward)
        observation = [{"type": "function_call_output", "call_id": str(out["call_id"]), "output": str(out["output"])}
                       for out in step_info.get("tool_outputs") or [] if isinstance(out, dict) and "call_id" in out]
        if not (terminated or truncated):
            observation += _said(reply.get("observation"))
        self.trajectory.extend(observation)
        info.update({k: v for k, v in numeric_fields(step_info).items() if k not in info})
        for key, value in step_info.items():
            if isinstance(value, str) and key not in info:
                info[key] = value[:500]
        if not (terminated or truncated) and self.turn >= self.max_steps:
            truncated = True  # the env's own limit, as NeMo Gym's agent has one
        if terminated or truncated:
            self._verdict(terminated, truncated, step_info, info)
        return observation, reward, terminated, truncated, info

    async def finish(self) -> StepResult:
        """End the episode now (``truncated``): its verdict sums the rewards so far; the server is not told."""
        if self.done:
            raise RuntimeError("the episode has ended (or never started): nothing to finish")
        info: dict[str, Any] = {"turn": self.turn, "num_tool_calls": 0}
        self._verdict(False, True, (self.last_step or {}).get("info") or {}, info)
        return [], 0.0, False, True, info

    def _turn_response(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """The model's turn as a ``Response`` (this turn's items only, as NeMo Gym's agent sends it)."""
        saved, self.trajectory = self.trajectory, list(items)
        try:
            return self._response_json()
        finally:
            self.trajectory = saved

    def _check(self, reply: Any) -> tuple[float, bool, bool, dict[str, Any]]:
        def bad(why: str) -> ServerError:
            return ServerError(f"step reply {why}: {str(reply)[:200]}", server=self.client.base_url, route="/step",
                               task_index=self.task_index)

        if not isinstance(reply, dict):
            raise bad("is not a JSON object")
        reward = reply.get("reward", 0.0)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise bad(f"has a reward that is not a finite number ({str(reward)[:40]!r})")
        missing = [name for name in ("terminated", "truncated") if name not in reply]
        if missing:
            raise bad(f"lacks {' and '.join(missing)}")
        flags = [reply[name] for name in ("terminated", "truncated")]
        if not all(isinstance(flag, bool) for flag in flags):
            raise bad("has terminated/truncated that are not booleans")
        if not isinstance(reply.get("observation"), (str, type(None))):
            raise bad("has an observation that is not text")
        info = reply.get("info") or {}
        if not isinstance(info, dict):
            raise bad("has an info that is not a JSON object")
        return float(reward), flags[0], flags[1], info

    def _verdict(self, terminated: bool, truncated: bool, step_info: dict[str, Any], info: dict[str, Any]) -> None:
        total = float(sum(self.rewards))
        self.done = True
        params = {**self.task["responses_create_params"], "input": self.prompt}  # as NeMo Gym's agent records it
        self.last_verify = {**self.task, "responses_create_params": params, "response": self._response_json(),
                            "reward": total, "terminated": terminated, "truncated": truncated, "info": step_info}
        if isinstance(step_info.get("user_usage"), dict):  # a simulated user's tokens, apart from the agent's
            self.last_verify["user_usage"] = step_info["user_usage"]
        verdict_info(self.last_verify, info)
        info["reward"] = total  # the episode's return; the step's own reward is the step result's


def _said(observation: Any) -> list[dict[str, Any]]:
    """The server's observation as the user message the model reads next (none for null or empty)."""
    return [{"type": "message", "role": "user", "content": observation}] if observation else []
