"""GRPO with NeMo RL on nemo_gym_env's resources servers: prepare the data, then train.

NeMo RL's GRPO plays NeMo Gym through a Ray actor created in its ``setup()``. This script
registers ours in its place (``nemo_gym_env.adapters.nemo_rl.register_with_nemo_rl``) and
then runs NeMo RL's own NeMo Gym entry point, ``examples/nemo_gym/run_grpo_nemo_gym.py``,
in this process, on ``grpo_nemo_gym_env.yaml`` composed over NeMo RL's NeMo Gym example::

    # 1. rows for NeMo RL: the bundled math examples, or your NeMo Gym JSONL (--input)
    python recipes/nemo_rl/run_grpo.py prepare --server math --input data/math_train.jsonl
    # 2. train (inside NeMo RL's environment; Hydra-style overrides go to NeMo RL)
    python recipes/nemo_rl/run_grpo.py train --nemo-rl-dir ~/RL grpo.max_num_steps=20

Everything else (vLLM, the policy, the loss, checkpoints, logging) is NeMo RL's; see
``recipes/nemo_rl/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import runpy
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE_EXAMPLE = "examples/nemo_gym/grpo_workplace_assistant_nemotron_nano_v2_9b.yaml"
RUNNER = "examples/nemo_gym/run_grpo_nemo_gym.py"
PLACEHOLDER = "NEMO_RL_NEMO_GYM_EXAMPLE"


@dataclass
class PrepareSettings:
    """What ``prepare`` writes."""

    server: str = "math"
    """The resources server the rows are for: their ``agent_ref.name`` (a bundled name or a config instance)."""
    input: str | None = None
    """NeMo Gym JSONL rows; default: the bundled server's ``data/example.jsonl``."""
    out: str = "results/nemo_rl_data"
    """Folder receiving ``train.jsonl`` and ``validation.jsonl``."""
    validation_fraction: float = 0.1
    """Share of rows held out for validation (at least one row)."""
    seed: int = 0
    """Shuffle seed of the split."""


def prepare(settings: PrepareSettings) -> None:
    """Write NeMo RL's train/validation files: valid rows, each with ``agent_ref`` naming the server."""
    from nemo_gym_env.launch.catalog import bundled_dataset
    from nemo_gym_env.protocol.dataset import iter_rows

    source = Path(settings.input) if settings.input else bundled_dataset(settings.server)
    rows, bad = [], 0
    for number, row, problem in iter_rows(source):
        if row is None:
            print(f"{source}:{number}: skipped: {problem}", file=sys.stderr)
            bad += 1
            continue
        row.setdefault("agent_ref", {"type": "resources_servers", "name": settings.server})
        rows.append(row)
    if len(rows) < 2:
        raise SystemExit(f"{source} has {len(rows)} valid row(s); GRPO needs at least 2 (train and validation)")
    random.Random(settings.seed).shuffle(rows)
    held_out = max(1, int(len(rows) * settings.validation_fraction))
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("validation", rows[:held_out]), ("train", rows[held_out:])):
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in part)
    print(f"wrote {len(rows) - held_out} train and {held_out} validation rows to {out}/ ({bad} invalid skipped)")


@dataclass
class TrainSettings:
    """Where NeMo RL is and which config to run."""

    nemo_rl_dir: str | None = None
    """NeMo RL checkout (default: ``$NEMO_RL_DIR``, else the one ``nemo_rl`` is imported from)."""
    config: str = str(HERE / "grpo_nemo_gym_env.yaml")
    """Our config; its ``defaults`` placeholder becomes NeMo RL's NeMo Gym example."""


def nemo_rl_checkout(settings: TrainSettings) -> Path:
    if settings.nemo_rl_dir or os.environ.get("NEMO_RL_DIR"):
        root = Path(settings.nemo_rl_dir or os.environ["NEMO_RL_DIR"]).expanduser().resolve()
    else:
        try:
            import nemo_rl
        except ImportError:
            raise SystemExit("NeMo RL is not importable: run inside its environment (uv run / its venv), "
                             "or pass --nemo-rl-dir") from None
        root = Path(nemo_rl.__file__).resolve().parent.parent
    for needed in (BASE_EXAMPLE, RUNNER):
        if not (root / needed).is_file():
            raise SystemExit(f"{root / needed} not found: --nemo-rl-dir must be a NeMo RL checkout "
                             "(git clone https://github.com/NVIDIA-NeMo/RL)")
    return root


def train(settings: TrainSettings, overrides: list[str]) -> None:
    """Register our actor, compose the config, and hand over to NeMo RL's NeMo Gym GRPO runner."""
    from nemo_gym_env.adapters.nemo_rl import register_with_nemo_rl

    root = nemo_rl_checkout(settings)
    register_with_nemo_rl()  # before NeMo RL's setup() creates the NeMo Gym actor
    text = Path(settings.config).read_text(encoding="utf-8")
    if PLACEHOLDER not in text:
        raise SystemExit(f"{settings.config} has no `defaults: {PLACEHOLDER}` line to point at NeMo RL's example")
    composed = Path(tempfile.mkdtemp(prefix="nemo_gym_env_grpo_")) / "grpo_nemo_gym_env.yaml"
    composed.write_text(text.replace(PLACEHOLDER, str(root / BASE_EXAMPLE)), encoding="utf-8")
    print(f"config: {composed} (defaults: {root / BASE_EXAMPLE})")
    sys.argv = [str(root / RUNNER), "--config", str(composed), *overrides]
    runpy.run_path(str(root / RUNNER), run_name="__main__")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    p = steps.add_parser("prepare", help="write NeMo RL's train/validation JSONL")
    p.add_argument("--server", default=PrepareSettings.server)
    p.add_argument("--input", default=None)
    p.add_argument("--out", default=PrepareSettings.out)
    p.add_argument("--validation-fraction", type=float, default=PrepareSettings.validation_fraction)
    p.add_argument("--seed", type=int, default=PrepareSettings.seed)
    t = steps.add_parser("train", help="run NeMo RL's GRPO with our actor (extra args: NeMo RL overrides)")
    t.add_argument("--nemo-rl-dir", default=None)
    t.add_argument("--config", default=TrainSettings.config)
    args, overrides = parser.parse_known_args()
    if args.step == "prepare":
        if overrides:
            parser.error(f"unexpected arguments for prepare: {overrides}")
        prepare(PrepareSettings(args.server, args.input, args.out, args.validation_fraction, args.seed))
    else:
        train(TrainSettings(args.nemo_rl_dir, args.config), overrides)


if __name__ == "__main__":
    main()
