"""Mixtures: several environments by weight, as one vector env, one task list or one TRL dataset.

``gym.make_vec("NemoGym/Mixture-v0", num_envs=256, envs={"NemoGym/math-v0": 0.5, "NemoGym/mcqa-v0": 0.5})``
gives a :class:`NemoGymMixtureVectorEnv` whose sub-envs each play one environment for good.
How many sub-envs play each environment is fixed at make time (:func:`apportion`: each
environment with a positive weight gets at least one, the rest by largest remainder), and
which sub-env plays which is a permutation drawn from ``assignment_seed`` (deterministic).

The same weights give a task list (:func:`mixture_rows`): every row names its server in
``agent_ref`` (so ``nemo-gym-env rollouts`` routes it) and its env id under ``environment``
(TRL's multi-environment column, see ``nemo_gym_env.adapters.trl.mixture_dataset``).

Light on purpose: this module imports no Gymnasium; the vector env lives in
:mod:`nemo_gym_env.envs.mixture_vector`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nemo_gym_env.envs.registration import GENERIC_ID, MIXTURE_ID, server_name
from nemo_gym_env.errors import ConfigError, UnknownServerError
from nemo_gym_env.protocol.keys import AGENT_REF_KEY

__all__ = ["ENVIRONMENT_KEY", "MIXTURE_ID", "MixtureEntry", "apportion", "assign", "checked_entries", "draw_mixture",
           "entry_env_kwargs", "mixture_entries", "mixture_rows"]

ENVIRONMENT_KEY = "environment"
"""The column naming a row's env id (the name TRL's multi-environment ``environment_factory`` reads)."""

ENTRY_KEYS = frozenset({"weight", "base_url", "dataset", "config_paths"})
"""What a mixture entry given as a dict may hold, besides the other vector env arguments."""


class MixtureEntry:
    """One environment of a mixture: its id, bundled server name, weight and own arguments."""

    def __init__(self, env_id: str, server: str | None, weight: float, kwargs: dict[str, Any]):
        self.env_id, self.server, self.weight, self.kwargs = env_id, server, weight, kwargs

    def __repr__(self) -> str:
        return f"MixtureEntry({self.env_id!r}, weight={self.weight})"


def _server_of(env_id: str) -> str | None:
    """The bundled server behind an id (None for the generic id); a mixture's own error otherwise."""
    if env_id == GENERIC_ID:
        return None
    try:
        server = server_name(env_id)
    except UnknownServerError as exc:
        raise ConfigError(f"mixture: {exc.args[0]}") from None
    if server is None:
        raise ConfigError(f"mixture: {env_id} cannot be an environment of a mixture; use bundled ids or "
                          f"{GENERIC_ID} with base_url and dataset")
    return server


def mixture_entries(envs: Mapping[str, Any]) -> list[MixtureEntry]:
    """Check a mixture's ``envs`` and return its entries with a positive weight, in the given order.

    Each value is a weight, or a dict with ``weight`` and that environment's own arguments
    (``base_url``: a running server instead of starting the bundled one; ``dataset``; any other
    vector env argument such as ``max_steps``).

    Raises:
        ConfigError: not a non-empty mapping, an unknown env id, a weight that is not a finite
            number >= 0, or weights that sum to 0.
    """
    if not isinstance(envs, Mapping) or not envs:
        raise ConfigError("mixture: envs must be a non-empty dict of env id -> weight, e.g. "
                          "{'NemoGym/math-v0': 0.5, 'NemoGym/mcqa-v0': 0.5}")
    entries = []
    for env_id, value in envs.items():
        if not isinstance(env_id, str):
            raise ConfigError(f"mixture: env ids are strings, got {env_id!r}")
        kwargs: dict[str, Any] = {}
        if isinstance(value, Mapping):
            if "weight" not in value:
                raise ConfigError(f"mixture: {env_id}: a dict entry needs a 'weight'")
            kwargs = {k: v for k, v in value.items() if k != "weight"}
            value = value["weight"]
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not math.isfinite(float(value)):
            raise ConfigError(f"mixture: {env_id}: the weight must be a finite number, got {value!r}")
        if value < 0:
            raise ConfigError(f"mixture: {env_id}: the weight must be >= 0, got {value}")
        server = _server_of(env_id)
        if server is None and (kwargs.get("base_url") is None and kwargs.get("config_paths") is None
                               or kwargs.get("dataset") is None):
            raise ConfigError(f"mixture: {env_id} needs {{'weight': ..., 'base_url': ..., 'dataset': ...}}")
        entries.append(MixtureEntry(env_id, server, float(value), kwargs))
    positive = [e for e in entries if e.weight > 0]
    if not positive:
        raise ConfigError(f"mixture: the weights sum to 0 ({', '.join(f'{e.env_id}={e.weight}' for e in entries)}); "
                          "give at least one environment a positive weight")
    return positive


def apportion(weights: Sequence[float], total: int) -> list[int]:
    """Split ``total`` into integer counts proportional to ``weights`` (all > 0), each at least 1.

    Largest remainder (Hamilton): the floors of the exact quotas, then one more to the largest
    remainders (earlier entries first on ties); an entry left at 0 takes one from the largest.

    Example:
        >>> apportion([0.5, 0.5], 256), apportion([3, 1], 10), apportion([0.98, 0.01, 0.01], 3)
        ([128, 128], [8, 2], [1, 1, 1])
    """
    if total < len(weights):
        raise ConfigError(f"mixture: {total} slots cannot give each of the {len(weights)} environments with a "
                          "positive weight one; raise num_envs (or num_rows) or drop an environment")
    s = float(sum(weights))
    quotas = [w / s * total for w in weights]
    counts = [int(math.floor(q)) for q in quotas]
    order = sorted(range(len(weights)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in order[:total - sum(counts)]:
        counts[k] += 1
    for k in range(len(counts)):
        if counts[k] == 0:
            donor = max(range(len(counts)), key=lambda j: (counts[j], -j))
            counts[donor] -= 1
            counts[k] = 1
    return counts


def assign(entries: Sequence[MixtureEntry], num_envs: int, seed: int | None = 0) -> list[str]:
    """The env id each of ``num_envs`` sub-envs plays: the apportioned counts, permuted by ``seed``.

    ``seed=None`` keeps them in blocks, in the entries' order.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        raise ConfigError(f"mixture: num_envs must be an int >= 1, got {num_envs!r}")
    counts = apportion([e.weight for e in entries], int(num_envs))
    ids = [e.env_id for e, n in zip(entries, counts) for _ in range(n)]
    if seed is None:
        return ids
    return [ids[k] for k in np.random.default_rng(seed).permutation(len(ids))]


def entry_env_kwargs(entry: MixtureEntry) -> dict[str, Any]:
    """An entry's own env arguments, its bundled server's example data as ``dataset`` unless it gives one."""
    from nemo_gym_env.launch.catalog import bundled_dataset

    kwargs = dict(entry.kwargs)
    if entry.server is not None and kwargs.get("dataset") is None:
        kwargs["dataset"] = str(bundled_dataset(entry.server))
    return kwargs


def draw_mixture(envs: Mapping[str, Any], num_rows: int | None = None, *,
                 seed: int = 0) -> list[tuple[MixtureEntry, int, dict[str, Any]]]:
    """``(entry, task index, task row)`` for ``num_rows`` draws, as :func:`mixture_rows` makes them."""
    from nemo_gym_env.protocol.dataset import load_rows

    entries = mixture_entries(envs)
    sources = []
    for entry in entries:
        rows = load_rows(entry_env_kwargs(entry)["dataset"])
        if not rows:
            raise ConfigError(f"mixture: {entry.env_id} has no task rows")
        sources.append(rows)
    if num_rows is None:
        num_rows = sum(len(rows) for rows in sources)
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise ConfigError(f"mixture: num_rows must be an int >= 1, got {num_rows!r}")
    counts = apportion([e.weight for e in entries], num_rows)
    rng = np.random.default_rng(seed)
    drawn = []
    for entry, rows, count in zip(entries, sources, counts):
        order: list[int] = []
        while len(order) < count:
            order.extend(int(k) for k in rng.permutation(len(rows)))
        drawn.extend((entry, k, rows[k]) for k in order[:count])
    return [drawn[k] for k in rng.permutation(len(drawn))]


def mixture_rows(envs: Mapping[str, Any], num_rows: int | None = None, *, seed: int = 0) -> list[dict[str, Any]]:
    """Task rows of a mixture: ``num_rows`` rows, each environment's share by weight, shuffled.

    Each environment's rows are its ``dataset`` (when its entry gives one) or its bundled
    server's example data; they are drawn in a seeded random order, every row once before any
    row twice. Every row gets ``agent_ref`` (``{"type": "resources_servers", "name": server}``,
    unless it has one: ``nemo-gym-env rollouts`` routes rows by it) and ``environment`` (its env
    id). ``num_rows`` defaults to the number of rows of all environments together.

    Example:
        >>> rows = mixture_rows({"NemoGym/math-v0": 3, "NemoGym/mcqa-v0": 1}, 8)
        >>> sorted(r["agent_ref"]["name"] for r in rows)
        ['math', 'math', 'math', 'math', 'math', 'math', 'mcqa', 'mcqa']
    """
    out = []
    for entry, _, task in draw_mixture(envs, num_rows, seed=seed):
        row = dict(task)
        if entry.server is not None:
            row.setdefault(AGENT_REF_KEY, {"type": "resources_servers", "name": entry.server})
        row[ENVIRONMENT_KEY] = entry.env_id
        out.append(row)
    return out


def checked_entries(envs: Mapping[str, Any] | None, kwargs: Mapping[str, Any],
                    allowed: frozenset[str]) -> list[MixtureEntry]:
    """The entries of a mixture's ``envs``, with the constructor's other keyword arguments and each
    entry's keys checked against ``allowed`` (what every sub-env takes); a clear ConfigError otherwise."""
    if envs is None:
        raise ConfigError("NemoGym/Mixture-v0 needs envs={env id: weight, ...}, e.g. "
                          "{'NemoGym/math-v0': 0.5, 'NemoGym/mcqa-v0': 0.5}")
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ConfigError(f"mixture: unknown arguments {unknown}; per-environment base_url, dataset and "
                          f"config_paths go in its entry: envs={{id: {{'weight': w, 'base_url': ...}}}}")
    entries = mixture_entries(envs)
    for entry in entries:
        extra = sorted(set(entry.kwargs) - ENTRY_KEYS - allowed)
        if extra:
            raise ConfigError(f"mixture: {entry.env_id}: unknown entry keys {extra}; use {sorted(ENTRY_KEYS | allowed)}")
    return entries
