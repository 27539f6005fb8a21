"""``example_single_tool_call``: one weather tool, rewarded for calling it with a city.

Tools:
    ``POST /get_weather`` ``{"city": str}`` -> ``{"city": ..., "weather_description": ...}``
    (always cold: the tool is a stub, the point is the call).

Reward: 1.0 when the episode's ``response.output`` holds a ``function_call`` to
``get_weather`` whose ``arguments`` parse as a JSON object with a non-empty string ``city``;
0.0 otherwise. NeMo Gym's server of the same name gives 1.0 to every episode; this one
scores the call so that the environment can tell a policy that uses the tool from one that
does not. Metric: ``num_tool_calls``, the number of ``function_call`` items in the episode.

Run standalone (the launcher passes the config): ``python app.py``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from nemo_gym_env.server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)

__all__ = [
    "GetWeatherRequest",
    "GetWeatherResponse",
    "SimpleWeatherResourcesServer",
    "SimpleWeatherResourcesServerConfig",
    "SimpleWeatherVerifyResponse",
    "valid_weather_call",
]

TOOL_NAME = "get_weather"


class SimpleWeatherResourcesServerConfig(BaseResourcesServerConfig):
    """Configuration of the weather server; nothing beyond the base keys."""


class GetWeatherRequest(BaseModel):
    """Arguments of ``get_weather``."""

    city: str


class GetWeatherResponse(BaseModel):
    """Reply of ``get_weather``."""

    city: str
    weather_description: str


class SimpleWeatherVerifyResponse(BaseVerifyResponse):
    """Verify reply: the request echoed back, the reward and the number of tool calls."""

    num_tool_calls: int


def valid_weather_call(item: Any) -> bool:
    """Whether an output item is a ``get_weather`` call whose arguments name a (non-blank) city."""
    if getattr(item, "type", None) != "function_call" or getattr(item, "name", None) != TOOL_NAME:
        return False
    try:
        arguments = json.loads(item.arguments)
    except (TypeError, ValueError):
        return False
    city = arguments.get("city") if isinstance(arguments, dict) else None
    return isinstance(city, str) and bool(city.strip())


class SimpleWeatherResourcesServer(SimpleResourcesServer):
    """The ``example_single_tool_call`` resources server."""

    REVERIFY_MODE = "stateless"  # /verify reads only its body: a stored rollout can be scored again

    config: SimpleWeatherResourcesServerConfig = Field(default_factory=SimpleWeatherResourcesServerConfig)

    def setup_webserver(self) -> FastAPI:
        """Standard routes plus ``POST /get_weather``."""
        app = super().setup_webserver()
        app.post(f"/{TOOL_NAME}")(self.get_weather)
        return app

    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        """Describe the weather in ``body.city`` (a stub: it is always cold)."""
        return GetWeatherResponse(city=body.city, weather_description=f"The weather in {body.city} is cold.")

    async def verify(self, body: BaseVerifyRequest) -> SimpleWeatherVerifyResponse:
        """1.0 if the episode called ``get_weather`` with a city, else 0.0."""
        output = body.response.output
        num_tool_calls = sum(1 for item in output if getattr(item, "type", None) == "function_call")
        reward = 1.0 if any(valid_weather_call(item) for item in output) else 0.0
        # Merged, not passed twice: a re-verified rollout row may already carry these keys.
        fields = {**body.model_dump(), "reward": reward, "num_tool_calls": num_tool_calls}
        return SimpleWeatherVerifyResponse(**fields)


if __name__ == "__main__":
    SimpleWeatherResourcesServer.run_webserver()
