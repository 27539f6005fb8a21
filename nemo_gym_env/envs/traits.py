"""Which protocol a server speaks, and the episode that speaks it.

Two kinds of server stand behind the same env:

- **resources servers** (``/seed_session``, tools as ``POST /<tool>``, ``/verify``): NeMo Gym's
  ``SimpleResourcesServer`` and ours, played by :class:`~nemo_gym_env.envs.episode.Episode`;
- **Gymnasium-protocol servers** (``/reset``, ``/step``): NeMo Gym's ``GymnasiumServer``
  (blackjack, wordle, ...) and ours (:mod:`nemo_gym_env.server.gymnasium`), played by
  :class:`~nemo_gym_env.envs.gymnasium_episode.GymnasiumEpisode`.

How the protocol is told, once per server and process: ``GET`` on the routes that tell the
protocols apart (``/seed_session``, ``/reset``, ``/step``, ``/close_session``, ``/verify``), all
at once. They are ``POST`` routes, so a server that has one answers ``405`` and a server that
has not ``404``, with no side effect and no work on the server (FastAPI's routing, NeMo Gym's
servers and ours alike). ``/reset`` and ``/step`` without ``/seed_session`` is the Gymnasium
protocol. (``GET /openapi.json`` would say the same, but building that document costs a
resources server seconds of CPU on its first request, in the way of the first ``reset``.) A
server that answers ``404`` to every ``GET`` is probed with ``POST /seed_session`` and an empty
body, then ``POST /reset`` (a 404 means the route is not there; anything else, even a 422, that
it is). A server that has neither is an error naming the routes tried. The env's ``protocol``
argument skips the detection.

What was told is kept per address and process. A server that stops at an address and another
that speaks the other protocol starts there (a freed port taken again) would make the kept
answer wrong: :func:`begin_episode` takes a ``404`` on the first route of an episode, when the
protocol was detected, as that, tells the protocol afresh and starts the episode once more.

The same answers say whether the env should send NeMo Gym 0.7's ``POST /close_session`` at the
end of an episode: when the server has that route, unless it frees a session's state at
``/verify`` already (ours say so with an ``x-releases-session`` header on the ``405`` of
``GET /verify``), which saves a request per episode.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.episode import Episode
from nemo_gym_env.envs.gymnasium_episode import GymnasiumEpisode
from nemo_gym_env.errors import ConnectFailed, ServerError, TransportError
from nemo_gym_env.protocol.types import RELEASES_SESSION

__all__ = ["PROTOCOLS", "ServerTraits", "begin_episode", "open_episode", "server_traits", "start_episode"]

PROTOCOLS = ("resources", "gymnasium")
"""The protocols an env speaks."""


@dataclass(frozen=True)
class ServerTraits:
    """What an env needs to know of a server before its first episode."""

    protocol: str
    """``"resources"`` or ``"gymnasium"``."""
    close_session: bool = False
    """Send ``POST /close_session`` when an episode ends."""
    found_by: str = "given"
    """How it was told: ``"given"``, ``"routes"``, ``"probe"``, or ``"unreachable"`` (not told: asked again)."""


async def server_traits(client: ResourcesClient, protocol: str = "auto") -> ServerTraits:
    """The traits of ``client``'s server: ``protocol`` when given, else detected (see the module docstring).

    Raises:
        ServerError: the server speaks neither protocol (one that cannot be reached is taken for
            a resources server, whose first request then fails, and is asked again next time).
        ValueError: ``protocol`` is not ``"auto"`` or one of :data:`PROTOCOLS`.
    """
    if protocol != "auto":
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be 'auto' or one of {PROTOCOLS}, got {protocol!r}")
        return ServerTraits(protocol)
    known = _KNOWN.get(client.base_url)
    if known is None:
        known = await _detect(client)
        if known.found_by != "unreachable":
            _KNOWN[client.base_url] = known
            while len(_KNOWN) > 1024:
                _KNOWN.pop(next(iter(_KNOWN)))
    return known


_KNOWN: dict[str, ServerTraits] = {}  # base URL -> traits: told once per server and process


_ROUTES = ("/seed_session", "/reset", "/step", "/close_session", "/verify")


async def _detect(client: ResourcesClient) -> ServerTraits:
    try:
        replies = await asyncio.gather(*(client.http.request("GET", route, timeout_s=client.timeout_s)
                                          for route in _ROUTES))
    except (ConnectFailed, TransportError, TimeoutError):
        # Down for now: a resources server is assumed, so its episode fails as such (naming
        # /seed_session), and the next episode asks again.
        return ServerTraits("resources", found_by="unreachable")
    has = {route for route, reply in zip(_ROUTES, replies) if reply.status_code != 404}
    if has:
        if {"/reset", "/step"} <= has and "/seed_session" not in has:
            return ServerTraits("gymnasium", found_by="routes")
        if "/seed_session" in has:
            releases = any(v.lower() == "true" for v in replies[-1].header_values(RELEASES_SESSION))
            return ServerTraits("resources", close_session="/close_session" in has and not releases,
                                found_by="routes")
    for route, kind in (("/seed_session", "resources"), ("/reset", "gymnasium")):
        reply = await client.post_raw(route, {}, {})
        if reply.status_code != 404:
            return ServerTraits(kind, found_by="probe")
    raise ServerError("speaks neither protocol: POST /seed_session and POST /reset both answered 404 (as did "
                      f"GET on {', '.join(_ROUTES)}); is this a resources server?", server=client.base_url,
                      route="/seed_session")


def open_episode(traits: ServerTraits, client: ResourcesClient, row: dict[str, Any], task_index: int | None,
                 max_steps: int, *, episode_reward: str = "verify") -> Episode:
    """A new episode of ``row`` on ``client``'s server, speaking the server's protocol.

    ``episode_reward`` (``"verify"`` or ``"sum"``, see :class:`Episode`) applies to resources
    servers; a Gymnasium-protocol server's episode reward is already the sum of its step rewards.
    """
    if traits.protocol == "gymnasium":
        return GymnasiumEpisode(client, row, task_index, max_steps)
    return Episode(client, row, task_index, max_steps, close_session=traits.close_session,
                   episode_reward=episode_reward)


async def start_episode(client: ResourcesClient, protocol: str, row: dict[str, Any], task_index: int | None,
                        max_steps: int, *, episode_reward: str = "verify") -> tuple[Episode, list, dict]:
    """A started episode of ``row`` on ``client``'s server, with its first observation and info.

    Tells the protocol (:func:`server_traits`), opens the episode (:func:`open_episode`) and
    starts it (:func:`begin_episode`).

    Raises:
        ServerError: the server cannot start the episode.
    """
    traits = await server_traits(client, protocol)
    return await begin_episode(open_episode(traits, client, row, task_index, max_steps, episode_reward=episode_reward),
                               protocol)


async def begin_episode(episode: Episode, protocol: str = "auto") -> tuple[Episode, list, dict]:
    """Start an opened episode: the episode (the same, or one opened again), its first observation and info.

    When the protocol was detected (``protocol="auto"``) and the first route of the episode's
    protocol (``/seed_session`` or ``/reset``) answers ``404``, another server may answer at that
    address now: the protocol is told afresh and, when it changed, the episode is opened again
    for the new protocol and started (a ``404`` is a route that is not there: nothing ran).

    Raises:
        ServerError: the server cannot start the episode.
    """
    try:
        observation, info = await episode.start()
    except ServerError as exc:
        if exc.status_code != 404 or protocol != "auto":
            raise
        client = episode.client
        opened = "gymnasium" if isinstance(episode, GymnasiumEpisode) else "resources"
        told = _KNOWN.get(client.base_url)
        if told is None or told.protocol == opened:  # not yet told afresh by another episode
            _KNOWN.pop(client.base_url, None)
            told = await server_traits(client, protocol)
        if told.protocol == opened:
            raise
        episode = open_episode(told, client, episode.task, episode.task_index, episode.max_steps,
                               episode_reward=episode.episode_reward)
        observation, info = await episode.start()
    return episode, observation, info
