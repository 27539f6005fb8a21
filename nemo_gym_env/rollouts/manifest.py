"""What a rollouts file was made with, so that ``--resume`` can refuse to mix runs.

Beside ``results/rollouts.jsonl`` lies ``results/rollouts_run.json``: the number of repeats,
the policy (kind, model, API), the sampling overrides, and a SHA-256 of every dataset the run
read, by path. A resume compares its own with it and refuses, naming each difference, when
the rows it would add could not be compared with the rows already there (other repeats,
another policy, other sampling, a dataset whose content changed under the same path);
``--allow-changes`` goes on anyway. Running more or fewer servers, or adding another dataset,
is not a difference: the rows of each identity are what they were.

The manifest is written atomically (a temporary file renamed over it), before any row of the
run is: a kill never leaves it half-written.

Example:
    >>> old = RunManifest(num_repeats=2, policy={"kind": "scripted"}, sampling={}, inputs={"a.jsonl": "x"})
    >>> new = RunManifest(num_repeats=4, policy={"kind": "scripted"}, sampling={}, inputs={"a.jsonl": "y"})
    >>> differences(old, new)
    ['--num-repeats was 2, now 4', "a.jsonl changed since the file was written (its content's SHA-256 differs)"]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym_env.errors import RolloutFileError

__all__ = ["RunManifest", "differences", "file_digest", "manifest_path", "read_manifest", "write_manifest"]

FORMAT = 1


def manifest_path(output: str | Path) -> Path:
    """``results/rollouts.jsonl`` -> ``results/rollouts_run.json``."""
    output = Path(output)
    return output.with_name(output.stem + "_run.json")


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes (streamed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class RunManifest:
    """The settings that make rows of one run comparable with the rows of another."""

    num_repeats: int
    policy: dict[str, Any]
    """``kind`` and, where they matter, ``model`` and ``api`` (never an endpoint's key)."""
    sampling: dict[str, Any]
    inputs: dict[str, str] = field(default_factory=dict)
    """Dataset path (or ``bundled:<server>``) -> SHA-256 of its content."""
    episode_reward: str = "verify"
    """What a row's ``reward`` is: the ``/verify`` reward, or ``sum`` (plus the step rewards).
    A manifest written before the option existed reads as ``verify``, which is what it was."""
    format: int = FORMAT

    def merged(self, other: RunManifest) -> RunManifest:
        """This run's manifest with the datasets of an earlier one kept (a resume adds, never forgets)."""
        return dataclasses.replace(self, inputs={**other.inputs, **self.inputs})


def differences(old: RunManifest, new: RunManifest) -> list[str]:
    """Why rows of ``new`` would not be comparable with rows of ``old``; empty when they are."""
    found = []
    if old.num_repeats != new.num_repeats:
        found.append(f"--num-repeats was {old.num_repeats}, now {new.num_repeats}")
    if old.policy != new.policy:
        found.append(f"the policy was {_show(old.policy)}, now {_show(new.policy)}")
    if old.episode_reward != new.episode_reward:
        found.append(f"--episode-reward was {old.episode_reward}, now {new.episode_reward}")
    if old.sampling != new.sampling:
        found.append(f"the sampling overrides were {_show(old.sampling)}, now {_show(new.sampling)}")
    for name, digest in new.inputs.items():
        if name in old.inputs and old.inputs[name] != digest:
            found.append(f"{name} changed since the file was written (its content's SHA-256 differs)")
    return found


def _show(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "none"


def read_manifest(output: str | Path) -> RunManifest | None:
    """The manifest beside a rollouts file; None when there is none (a file from an older version).

    Raises:
        RolloutFileError: it exists but cannot be read.
    """
    path = manifest_path(output)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RolloutFileError(f"{path}: cannot read the run's manifest ({exc}); delete it to resume without "
                               "checking the settings, or start over without --resume") from None
    try:
        known = {f.name for f in dataclasses.fields(RunManifest)}
        return RunManifest(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise RolloutFileError(f"{path}: not a run manifest ({exc})") from None


def write_manifest(output: str | Path, manifest: RunManifest) -> None:
    """Write the manifest atomically (temporary file, fsync, rename)."""
    path = manifest_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(dataclasses.asdict(manifest), handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
