"""``RayVectorEnv``: one Gymnasium vector env whose sub-envs are spread over Ray workers.

The sub-envs are cut into contiguous shards, one per worker. Each worker is a Ray actor
holding a :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv` of its shard, so its HTTP, JSON and
``Response`` validation run on that worker's own event loop and CPU; the driver only slices
the actions, fans each call out to every worker at once and joins the results in sub-env
order. The policy stays in the driver, as with any vector env::

    from nemo_gym_env.ray_cluster import RayVectorEnv

    envs = RayVectorEnv("NemoGym/math-v0", num_envs=4096, num_workers=8)   # a server per worker
    obs, infos = envs.reset(seed=0)
    obs, rewards, terminations, truncations, infos = envs.step(actions)    # None for ended sub-envs

With ``base_url`` (one URL, or the URLs of identical servers, e.g. placed by
:class:`~nemo_gym_env.ray_cluster.RayLauncher`) every worker talks to those servers, sub-env
``i`` pinned to ``base_url[i % len(base_url)]`` as in the local env. ``base_url`` may be the
``RayLauncher`` itself (its servers, by name): a server it places again after its node was lost
is followed, each episode that starts afterwards plays on the new address. Without it, every
worker starts the bundled server on its own node.

Before any worker starts, their CPUs are checked against what the cluster has free
(:func:`~nemo_gym_env.ray_cluster.capacity.require`): an env that cannot fit fails at once with the
numbers.

A step is checked on every worker before any worker plays it: a bad action (naming its
sub-env by its index in the whole env) raises and changes nothing.

A worker that dies (its process killed, its node lost) takes its episodes with it: its
sub-envs end that step truncated with ``infos["error"]``, a new worker takes the shard, and
the same tasks are played again from the start (at the next step with ``NEXT_STEP``, at
once with ``SAME_STEP``, at the next ``reset`` with ``DISABLED``). The other shards go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from nemo_gym_env.client.loop import background_loop
from nemo_gym_env.client.resources import ResourcesClient
from nemo_gym_env.envs.registration import server_name
from nemo_gym_env.envs.vector import NemoGymVectorEnv
from nemo_gym_env.envs.vector_base import NemoGymVectorBase, SubEnvStep
from nemo_gym_env.errors import ActionError
from nemo_gym_env.ray_cluster.capacity import require, spread
from nemo_gym_env.ray_cluster.connection import (
    connect,
    import_ray,
    kill_actor,
    lost_worker_errors,
    remote_class,
    remote_message,
)

__all__ = ["RayVectorEnv"]


class _ShardWorker:
    """One shard's :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv` in a Ray actor (wrapped by ``ray.remote`` on first use).

    Every call returns the shard's state with its result: which sub-envs need a reset and the
    task each one plays, so the driver can replay them if this worker dies.
    """

    def __init__(self, env_kwargs: dict[str, Any], num_envs: int, first_index: int):
        self.env = NemoGymVectorEnv(num_envs=num_envs, **env_kwargs)
        self.first_index = first_index
        self._turns: list | None = None

    def where(self) -> dict[str, Any]:
        import ray  # the optional dependency: only inside a Ray worker

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def retarget(self, urls: list[str]) -> None:
        """The servers' current URLs (in this shard's order): episodes that start from now on use them."""
        clients = self.env.clients
        for k, url in enumerate(urls[:len(clients)]):
            old = clients[k]
            if old.base_url != url.rstrip("/"):
                clients[k] = ResourcesClient(url, timeout_s=old.timeout_s, verify_timeout_s=old.verify_timeout_s,
                                             connect_retries=old.connect_retries, max_in_flight=old.http.max_in_flight)
        self.env.client = clients[0]

    def spaces(self) -> tuple[Any, Any]:
        return self.env.single_observation_space, self.env.single_action_space

    def state(self) -> tuple[list[bool], list[int | None]]:
        return (~self.env.live_mask).tolist(), [getattr(e, "task_index", None) for e in self.env.episodes]

    def reset(self, seeds: list[int | None], mask: list[bool], task_indices: list[int | None] | None) -> Any:
        self._turns = None
        return background_loop().run(self.env.reset_some(seeds, mask, task_indices)), self.state()

    def prepare(self, actions: list[Any]) -> tuple[str, str] | None:
        """Check the shard's actions; keep them for :meth:`play`. Returns ``(error type, message)`` or None."""
        try:
            self._turns = self.env.check_actions(actions, first_index=self.first_index)
        except (ActionError, ValueError) as exc:
            self._turns = None
            return type(exc).__name__, str(exc)
        return None

    def get_attr(self, name: str) -> list[Any]:
        return self.env.sub_env_attr(name)

    def play(self) -> Any:
        if self._turns is None:
            raise RuntimeError("play() without a successful prepare()")
        turns, self._turns = self._turns, None
        return background_loop().run(self.env.play_turns(turns)), self.state()

    def close(self) -> None:
        self.env.close()


class _Shard:
    """The driver's record of one worker: its sub-envs ``[start, stop)`` and what to replay."""

    def __init__(self, index: int, start: int, stop: int):
        self.index = index
        self.start = start
        self.stop = stop
        self.handle: Any = None
        self.needs_reset = [True] * (stop - start)
        self.tasks: list[int | None] = [None] * (stop - start)
        self.replay: list[int | None] | None = None  # tasks to play again after this shard's worker died
        self.restarts = 0

    @property
    def size(self) -> int:
        return self.stop - self.start


class RayVectorEnv(NemoGymVectorBase):
    """A vector env over resources servers whose sub-envs are spread over Ray workers.

    Args:
        server: A bundled server name, or a registered id (``"NemoGym/math-v0"``), or None
            with ``base_url``.
        num_envs: Sub-envs in all.
        num_workers: Ray workers (actors); sub-envs are split into this many contiguous shards.
        base_url: A running server's URL or a list of identical servers' URLs, reachable from
            every worker, or a :class:`~nemo_gym_env.ray_cluster.RayLauncher` whose servers (by
            name) are followed when one is placed again. Without it each worker starts the
            bundled ``server`` on its node.
        dataset: Task rows (a list, sent to the workers) or a JSONL path that exists on every node.
        autoreset_mode: As :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv`.
        num_cpus_per_worker: CPUs each worker reserves (spreads the workers over the nodes).
        address: The cluster (see :func:`~nemo_gym_env.ray_cluster.connect`).
        call_timeout_s: Longest a worker may take for one reset or step before it is counted lost.
        **env_kwargs: The rest of :class:`~nemo_gym_env.envs.vector.NemoGymVectorEnv`'s arguments
            (``max_steps``, ``request_timeout_s``, ``verify_timeout_s``, ``max_in_flight``, ``config_paths``).
    """

    def __init__(
        self,
        server: str | None = None,
        num_envs: int = 2,
        num_workers: int = 2,
        *,
        base_url: str | Sequence[str] | Any | None = None,
        dataset: str | Path | Sequence[dict[str, Any]] | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        num_cpus_per_worker: float = 1.0,
        address: str | None = None,
        call_timeout_s: float = 3600.0,
        **env_kwargs: Any,
    ):
        if num_workers < 1 or num_envs < num_workers:
            raise ValueError(f"need 1 <= num_workers <= num_envs, got num_workers={num_workers}, num_envs={num_envs}")
        if server is not None and "/" in server:
            named = server_name(server)
            if named is None:
                raise ValueError(f"{server} names no bundled server; pass base_url (and dataset) instead")
            server = named
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.num_envs = num_envs
        self.call_timeout_s = call_timeout_s
        self._ray = import_ray()
        connect(address)
        self._follow = base_url if hasattr(base_url, "urls") else None  # a RayLauncher: its current addresses
        if self._follow is not None:
            base_url = self._launcher_urls()
        urls = None if base_url is None else [base_url] if isinstance(base_url, str) else [str(u) for u in base_url]
        if urls is not None and not urls:
            raise ValueError("base_url is an empty list; give at least one server URL")
        self._urls = urls
        require(f"RayVectorEnv: {num_workers} worker(s) of {num_cpus_per_worker:g} CPU",
                [(num_cpus_per_worker, 0.0)] * num_workers, wait_s=5.0)
        self._env_kwargs = {"server": server, "dataset": list(dataset) if isinstance(dataset, Sequence)
                            and not isinstance(dataset, str) else dataset,
                            "autoreset_mode": self.autoreset_mode, **env_kwargs}
        self._cpus = num_cpus_per_worker
        parts = np.array_split(np.arange(num_envs), num_workers)  # the first num_envs % num_workers get one more
        self.shards = [_Shard(k, int(part[0]), int(part[-1]) + 1) for k, part in enumerate(parts)]
        self.lost_workers: list[tuple[int, str]] = []
        """(shard index, reason) for every worker that died and was replaced."""
        try:
            for shard, place in zip(self.shards, spread([(num_cpus_per_worker, 0.0)] * num_workers)):
                self._spawn(shard, place)  # the nodes in turn
            spaces = [self._ray.get(s.handle.spaces.remote(), timeout=call_timeout_s) for s in self.shards]
        except lost_worker_errors(self._ray) as exc:
            self.close()
            raise RuntimeError(f"a Ray worker could not start its shard of the vector env: {remote_message(exc)}") \
                from None
        except BaseException:
            self.close()
            raise
        self._setup(num_envs, self.autoreset_mode, None, *spaces[0])

    # ---- what the base asks for ------------------------------------------------------------
    # The workers are called with blocking ray.get: off the background loop, in a thread.

    async def _areset(self, seeds: list[int | None], mask: np.ndarray,
                      task_indices: list[int | None] | None) -> dict[int, tuple[list, dict]]:
        return await asyncio.to_thread(self._reset, seeds, mask, task_indices)

    async def _astep(self, actions: list[Any]) -> list[SubEnvStep]:
        return await asyncio.to_thread(self._step, actions)

    def sub_env_attr(self, name: str) -> list[Any]:
        """``name`` of every sub-env's episode, fetched from the workers (``None`` for a lost worker's)."""
        values = self._fan_out({s.index: ("get_attr", (name,)) for s in self.shards})
        return [item for s in self.shards
                for item in (values[s.index] if isinstance(values[s.index], list) else [None] * s.size)]

    def _reset(self, seeds: list[int | None], mask: np.ndarray,
               task_indices: list[int | None] | None) -> dict[int, tuple[list, dict]]:
        calls = {}
        for shard in self.shards:
            part = slice(shard.start, shard.stop)
            tasks = None if task_indices is None else task_indices[part]
            if shard.replay is not None:  # its worker died: its ended episodes start over on their tasks
                tasks = [shard.replay[j] if tasks is None or tasks[j] is None else tasks[j] for j in range(shard.size)]
                shard.replay = None
            calls[shard.index] = (seeds[part], mask[part].tolist(), tasks)
        results = self._fan_out({k: ("reset", args) for k, args in calls.items()})
        started: dict[int, tuple[list, dict]] = {}
        for shard in self.shards:
            outcome = results[shard.index]
            if isinstance(outcome, str):  # lost during reset: its sub-envs report it and start at their next step
                shard.replay = shard.tasks
                for j in range(shard.size):
                    if mask[shard.start + j]:
                        started[shard.start + j] = ([], {"task_index": -1, "error": outcome})
                continue
            for j, (obs, info) in outcome.items():
                started[shard.start + j] = (obs, info)
        return started

    def _step(self, actions: list[Any]) -> list[SubEnvStep]:
        replays = [s for s in self.shards if s.replay is not None]
        playing = [s for s in self.shards if s.replay is None]
        # Phase 1: every worker checks its actions; one bad action anywhere and nothing is played.
        for shard in replays:
            self._check_replay(shard, actions[shard.start:shard.stop])
        checks = self._fan_out({s.index: ("prepare", (actions[s.start:s.stop],)) for s in playing})
        for shard in playing:
            problem = checks[shard.index]
            if isinstance(problem, tuple):
                kind, message = problem
                raise (ActionError if kind == "ActionError" else ValueError)(message)
        calls: dict[int, tuple[str, tuple]] = {}
        idle = [s for s in replays if self.autoreset_mode == AutoresetMode.DISABLED]  # replayed at reset()
        for shard in replays:
            if shard not in idle:
                calls[shard.index] = ("reset", ([None] * shard.size, [True] * shard.size, shard.replay))
        for shard in playing:
            if isinstance(checks[shard.index], str):
                continue  # lost while checking: reported below
            calls[shard.index] = ("play", ())
        results = self._fan_out(calls)
        for shard in playing:
            if isinstance(checks[shard.index], str):
                results[shard.index] = checks[shard.index]
        rows: list[Any] = [None] * self.num_envs
        for shard in idle:
            rows[shard.start:shard.stop] = [(([], 0.0, False, False, {}), None)] * shard.size
        for shard in self.shards:
            if shard in idle:
                continue
            outcome = results[shard.index]
            if shard in replays and not isinstance(outcome, str):
                shard.replay = None
                for j, (obs, info) in outcome.items():
                    rows[shard.start + j] = ((obs, 0.0, False, False, info), None)
            elif isinstance(outcome, str):
                rows[shard.start:shard.stop] = self._lost_rows(shard, outcome)
            else:
                rows[shard.start:shard.stop] = outcome
        return rows

    @property
    def live_mask(self) -> np.ndarray:
        """Which sub-envs expect an action at the next :meth:`step` (the rest take ``None``)."""
        mask = np.zeros(self.num_envs, dtype=bool)
        for shard in self.shards:
            if shard.replay is None:
                mask[shard.start:shard.stop] = ~np.asarray(shard.needs_reset, dtype=bool)
        return mask

    def workers(self) -> list[dict[str, Any]]:
        """Where each shard runs: ``{"shard", "sub_envs", "pid", "node_id", "restarts"}``."""
        places = self._fan_out({s.index: ("where", ()) for s in self.shards})
        return [{"shard": s.index, "sub_envs": (s.start, s.stop), "restarts": s.restarts,
                 **(places[s.index] if isinstance(places[s.index], dict) else {"error": places[s.index]})}
                for s in self.shards]

    def close_extras(self, **kwargs: Any) -> None:
        """Close every shard's env (giving back its embedded server) and stop the workers."""
        for shard in getattr(self, "shards", []):
            if shard.handle is not None:
                with contextlib.suppress(Exception):  # a dead worker has nothing left to close
                    self._ray.get(shard.handle.close.remote(), timeout=30)
                kill_actor(self._ray, shard.handle)
                shard.handle = None

    # ---- internals -------------------------------------------------------------------------

    def _spawn(self, shard: _Shard, place: Any = None) -> None:
        kwargs = dict(self._env_kwargs)
        if self._urls is not None:
            kwargs["base_url"] = self._shard_urls(shard)
        place = place or spread([(self._cpus, 0.0)])[0]
        shard.handle = remote_class(_ShardWorker).options(num_cpus=self._cpus, scheduling_strategy=place,
                                                          max_restarts=0).remote(kwargs, shard.size, shard.start)
        shard.needs_reset = [True] * shard.size

    def _get(self, ref: Any) -> Any:
        return self._ray.get(ref, timeout=self.call_timeout_s)

    def _launcher_urls(self) -> list[str]:
        return [url for _, url in sorted(self._follow.urls.items())]

    def _shard_urls(self, shard: _Shard) -> list[str]:
        assert self._urls is not None
        turn = shard.start % len(self._urls)  # the whole env's pinning: sub-env i on urls[i % n]
        return self._urls[turn:] + self._urls[:turn]

    def _follow_servers(self) -> None:
        """A server the launcher placed again: every worker's next episodes go to its new address."""
        urls = self._launcher_urls()
        if urls == self._urls:
            return
        self._urls = urls
        for shard in self.shards:
            if shard.handle is not None:
                shard.handle.retarget.remote(self._shard_urls(shard))  # before the call that follows

    def _fan_out(self, calls: Mapping[int, tuple[str, tuple]]) -> dict[int, Any]:
        """Call ``method(*args)`` on the given shards' workers at once; a lost worker's result
        is the reason (a str), and the shard has a new worker already."""
        if self._follow is not None:
            self._follow_servers()
        refs = {k: getattr(self.shards[k].handle, method).remote(*args) for k, (method, args) in calls.items()}
        out: dict[int, Any] = {}
        for k, ref in refs.items():
            shard = self.shards[k]
            try:
                result = self._get(ref)
            except (*lost_worker_errors(self._ray), self._ray.exceptions.GetTimeoutError) as exc:
                out[k] = self._replace(shard, exc)
                continue
            if calls[k][0] in ("reset", "play"):  # these also report the shard's state
                result, (shard.needs_reset, tasks) = result
                shard.tasks = [t if t is not None else old for t, old in zip(tasks, shard.tasks)]
            out[k] = result
        return out

    def _replace(self, shard: _Shard, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()
        reason = (f"Ray worker of sub-envs {shard.start}-{shard.stop - 1} lost "
                  f"({type(exc).__name__}: {text[0][:300] if text else ''}); its episodes start over on a new worker")
        kill_actor(self._ray, shard.handle)
        self.lost_workers.append((shard.index, reason))
        shard.restarts += 1
        self._spawn(shard)
        shard.replay = list(shard.tasks)
        return reason

    def _check_replay(self, shard: _Shard, actions: list[Any]) -> None:
        """A replaced worker's sub-envs have ended: with NEXT_STEP and DISABLED they take None."""
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            return  # its restart already failed once (see _lost_rows): the actions are ignored
        for j, action in enumerate(actions):
            if action is not None:
                raise ValueError(f"sub-env {shard.start + j} has ended (its Ray worker was lost) and takes None as "
                                 "its action" + (", until reset with options={'reset_mask': ...}"
                                                 if self.autoreset_mode == AutoresetMode.DISABLED else ""))

    def _lost_rows(self, shard: _Shard, reason: str) -> list[SubEnvStep]:
        """The step of a shard whose worker died: truncated with the reason; replayed per the mode."""
        info = {"error": reason}
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            started = self._fan_out({shard.index: ("reset", ([None] * shard.size, [True] * shard.size,
                                                             shard.replay))})[shard.index]
            if not isinstance(started, str):
                shard.replay = None
                return [((started[j][0], 0.0, False, True, started[j][1]), {"final_obs": [], "final_info": info})
                        for j in range(shard.size)]
        return [(([], 0.0, False, True, dict(info)), None) for _ in range(shard.size)]

