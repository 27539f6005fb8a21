"""A GRPO step of the TRL recipe on the held-out proof's settings: how long, where the time goes, how much memory.

Runs ``recipes/trl_grpo.py`` itself (in a child process per variant, one after another) on
``badge_lookup`` with the proof's settings (8 episodes of one task per step, up to 3 turns,
``single`` and ``larger`` questions), with timers around the parts of a step:

- ``generation``: the model writing its turns (the rollout's ``Generate`` calls);
- ``environment``: the rest of the rollout: the server's HTTP (tool calls, ``/verify``), rendering, tokenizing;
- ``forward``: TRL's loss, the log-probabilities included;
- ``backward``: ``accelerator.backward`` (with activation checkpointing, the recomputed forward too);
- ``optimizer``: the optimizer's step;
- ``other``: the rest of the step (TRL's bookkeeping, callbacks).

Variants, side by side in one run (the ratio is what to compare on a shared machine):

- ``ours``: the recipe's defaults (the engine generates; each group scored on one pass over its
  prompt; activation checkpointing; Adafactor; bfloat16 matrix products where the CPU has them);
- ``ours_adamw``: the same with AdamW (two full copies of the weights' moments) in place of Adafactor;
- ``ours_glibc_defaults``: the same with glibc's allocator left as it comes (``nemo_gym_env/system/memory.py``);
- ``stock``: TRL's own paths with the settings the recipe had before (Hugging Face ``generate``,
  ``GRPOTrainer``'s scoring in micro-batches of 2, no checkpointing, AdamW, float32).

    python benchmarks/grpo_step.py                       # every variant, 4 steps each (the first is warm-up)
    python benchmarks/grpo_step.py --variants ours --steps 6

Writes ``results/grpo_step.json``: per variant and step the split above, the step's seconds,
the training process's peak RSS so far (and over the whole run); the load average before and after, the CPU's flags.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "trl_grpo.py"
sys.path.insert(0, str(HERE))

PROOF = ["env=NemoGym/badge_lookup-v0", "num_generations=8", "batch_size=8", "max_turns=3",
         "max_completion_length=160", "max_turn_tokens=48", "temperature=1.0",
         ("dataset={_target_: nemo_gym_env.servers.badge_lookup.make_dataset.make_dataset, size: 256, "
          "split: train, kinds: [single, larger]}")]
"""The held-out proof's settings (recipes/README.md) that decide a step's work: group, batch, turns, budgets,
temperature and question kinds. The proof's 1,000 rows and its shaping term change no step's work."""

VARIANTS = {
    "ours": [],
    "ours_adamw": ["optim=adamw_torch"],
    "ours_glibc_defaults": [],
    "stock": ["engine=false", "shared_prompt=false", "activation_checkpointing=false", "bf16=false",
              "optim=adamw_torch", "micro_batch_size=2"],
}
VARIANT_ENV = {"ours_glibc_defaults": {"NEMO_GYM_ENV_MALLOC_DEFAULTS": "1"}}
"""Environment of a variant's process (glibc's allocator as it comes: freed memory kept for reuse)."""
PARTS = ("generation", "environment", "forward", "backward", "optimizer")


def _worker(variant: str, steps: int, out: Path) -> None:
    """Run the recipe in this process with timers around a step's parts; write what they measured to ``out``."""
    import psutil

    process = psutil.Process()
    peak = {"rss": 0}

    def sample() -> None:
        while True:
            peak["rss"] = max(peak["rss"], process.memory_info().rss)
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()
    spent = {part: 0.0 for part in (*PARTS, "rollout")}
    steps_seen: list[dict[str, Any]] = []

    def timed(owner: Any, name: str, part: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - started

        setattr(owner, name, wrapper)

    import accelerate.optimizer
    from accelerate import Accelerator
    from trl import GRPOTrainer

    from nemo_gym_env.adapters.trl import rollout as rollout_module
    from nemo_gym_env.adapters.trl.progress import StepReport

    original_rollout = rollout_module.NemoGymRollout.rollout

    def rollout(self: Any, prompts: Any, generate: Any, **kwargs: Any) -> Any:
        def timed_generate(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return generate(*args)
            finally:
                spent["generation"] += time.perf_counter() - started

        return original_rollout(self, prompts, timed_generate, **kwargs)

    rollout_module.NemoGymRollout.rollout = rollout
    timed(rollout_module.NemoGymRollout, "__call__", "rollout")
    timed(GRPOTrainer, "compute_loss", "forward")
    timed(Accelerator, "backward", "backward")
    timed(accelerate.optimizer.AcceleratedOptimizer, "step", "optimizer")

    original_on_log = StepReport.on_log

    def on_log(self: Any, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        before = len(self.rows)
        result = original_on_log(self, args, state, control, logs=logs, **kwargs)
        if len(self.rows) > before:  # a step ended: close its books
            row = self.rows[-1]
            split = {part: round(spent[part], 2) for part in PARTS if part != "environment"}
            split["environment"] = round(spent["rollout"] - spent["generation"], 2)
            split["other"] = round(row["seconds"] - spent["rollout"] - spent["forward"] - spent["backward"]
                                   - spent["optimizer"], 2)
            steps_seen.append({"step": row["step"], "seconds": row["seconds"], "split": split,
                               "reward": row["reward"], "completion_tokens": row.get("completions/mean_length"),
                               "peak_rss_so_far_mb": round(peak["rss"] / 1e6)})  # since the process began
            for part in spent:
                spent[part] = 0.0
        return result

    StepReport.on_log = on_log
    import runpy

    sys.argv = [str(RECIPE), *PROOF, *VARIANTS[variant], f"steps={steps}", f"output_dir={out.parent / variant}"]
    runpy.run_path(str(RECIPE), run_name="__main__")
    out.write_text(json.dumps({"steps": steps_seen, "peak_rss_mb": round(peak["rss"] / 1e6)}))


def main(argv: list[str] | None = None) -> int:
    import harness

    from nemo_gym_env.system.cpu import machine_summary

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=4, help="steps per variant; the first is warm-up (default 4)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, args.steps, args.worker_out)
        return 0

    before = machine_summary()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            out = Path(tmp) / f"{variant}.json"
            started = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--worker", variant, "--steps", str(args.steps),
                                   "--worker-out", str(out)], capture_output=True, text=True, check=False,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", **VARIANT_ENV.get(variant, {})})
            if done.returncode != 0 or not out.exists():
                print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
                return 1
            runs[variant] = {**json.loads(out.read_text()), "wall_s": round(time.perf_counter() - started, 1),
                             "overrides": VARIANTS[variant]}
    after = machine_summary()
    rows = []
    for variant, run in runs.items():
        measured = run["steps"][1:] or run["steps"]  # the first step warms up (allocator, lazy imports)
        run["median_step_s"] = statistics.median(s["seconds"] for s in measured)
        run["median_split_s"] = {part: statistics.median(s["split"][part] for s in measured)
                                 for part in (*PARTS, "other")}
        rows.append([variant, f"{run['median_step_s']:.1f}",
                     *(f"{run['median_split_s'][p]:.1f}" for p in (*PARTS, "other")), run["peak_rss_mb"]])
    ratio = None
    if {"ours", "stock"} <= set(runs):
        ratio = round(runs["stock"]["median_step_s"] / runs["ours"]["median_step_s"], 2)
    harness.print_table(["variant", "step s", *PARTS, "other", "peak RSS MB"], rows,
                        title=f"GRPO step on the held-out proof's settings (median of steps 2..{args.steps})"
                              + (f"; stock / ours = {ratio}x" if ratio else ""))
    path = harness.write_results("grpo_step", {"settings": PROOF, "runs": runs, "stock_over_ours": ratio,
                                               "load_before": before, "load_after": after}, args.out)
    print(f"load average {before['load_avg_1m']} before, {after['load_avg_1m']} after; CPU flags "
          f"{', '.join(before['cpu_flags']) or 'none of note'}; results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
