"""One line a person reads per optimizer step, and whether the step could learn anything.

GRPO learns from the spread of rewards inside a group: a group whose episodes all scored the
same (all 0, all 1) has zero advantage, and a step in which every group is like that moves no
parameter (loss 0, gradient 0). TRL logs this as ``frac_reward_zero_std``; :func:`step_summary`
turns a step's logs into the counts behind it, and :class:`StepReport` prints::

    step  3/8  reward 0.250 ± 0.433  signal in 2/2 groups  grad 1.84  turns 1.9  21.4 s

or, for a step with nothing to learn from, says so and what to change.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ENV_REWARD_KEY", "NO_SIGNAL_ADVICE", "StepReport", "step_line", "step_summary"]

NO_SIGNAL_ADVICE = ("no group carried a learning signal (every episode of each group scored the same), "
                    "so no parameter moved; if this repeats, raise temperature or num_generations, "
                    "or train on tasks the model sometimes solves")


def _number(logs: Mapping[str, Any], key: str) -> float | None:
    value = logs.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


ENV_REWARD_KEY = "rewards/env_reward/mean"
"""Where TRL logs the environment's own reward on the ``rollout_func`` route (``rewards/<class>/mean`` on the
``environment_factory`` route)."""


def step_summary(logs: Mapping[str, Any], groups: int, env_reward_key: str = ENV_REWARD_KEY) -> dict[str, Any]:
    """The learning-signal counts of one step's TRL logs, for ``groups`` GRPO groups per step.

    Returns ``reward``, ``reward_std`` (over the step's episodes, of the reward GRPO optimizes),
    ``env_reward`` (the environment's own reward, logged under ``env_reward_key``, when other
    reward functions add shaping to it; else the same as ``reward``), ``groups``,
    ``groups_with_signal`` (groups whose rewards were not all equal; None when TRL logged no
    ``frac_reward_zero_std``), ``grad_norm``, ``loss``, ``turns`` and ``failed`` (share of
    episodes whose environment failed), None where the logs lack them.

    Example:
        >>> step_summary({"reward": 0.25, "reward_std": 0.43, "frac_reward_zero_std": 0.5}, 2)["groups_with_signal"]
        1
    """
    zero_std = _number(logs, "frac_reward_zero_std")
    own = _number(logs, env_reward_key)
    return {
        "reward": _number(logs, "reward"),
        "env_reward": own if own is not None else _number(logs, "reward"),
        "reward_std": _number(logs, "reward_std"),
        "groups": groups,
        "groups_with_signal": None if zero_std is None else round((1.0 - zero_std) * groups),
        "grad_norm": _number(logs, "grad_norm"),
        "loss": _number(logs, "loss"),
        "turns": _number(logs, "env/num_turns"),
        "failed": _number(logs, "env/failed"),
    }


def step_line(step: int, steps: int | None, summary: Mapping[str, Any], seconds: float) -> str:
    """The printed line of a step (see the module docstring).

    Example:
        >>> step_line(2, 8, {"reward": 0.0, "reward_std": 0.0, "groups": 2, "groups_with_signal": 0,
        ...                  "grad_norm": 0.0, "turns": 1.5, "failed": 0.0}, 20.0).split("  ")[1]
        'reward 0.000 ± 0.000'
    """
    width = len(str(steps)) if steps else 4
    head = f"step {step:>{width}}/{steps}" if steps else f"step {step:>4}"
    reward, spread = summary.get("reward"), summary.get("reward_std")
    parts = [head, "reward   n/a (every episode failed)" if reward is None
             else f"reward {reward:.3f} ± {spread if spread is not None else float('nan'):.3f}"]
    own = summary.get("env_reward")
    if reward is not None and own is not None and abs(own - reward) > 1e-9:
        parts.append(f"env reward {own:.3f}")
    with_signal = summary.get("groups_with_signal")
    if with_signal is not None:
        parts.append(f"signal in {with_signal}/{summary['groups']} groups")
    if summary.get("grad_norm") is not None:
        parts.append(f"grad {summary['grad_norm']:.3g}")
    if summary.get("turns") is not None:
        parts.append(f"turns {summary['turns']:.1f}")
    if summary.get("failed"):
        parts.append(f"failed {summary['failed']:.0%}")
    parts.append(f"{seconds:.1f} s")
    line = "  ".join(parts)
    if with_signal == 0:
        line += f"\n  -> {NO_SIGNAL_ADVICE}"
    return line


def _callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - the trl extra brings transformers
        return object
    return TrainerCallback


class StepReport(_callback_base()):
    """A ``TrainerCallback``: each optimizer step's line (:func:`step_line`) and its record.

    Args:
        groups: GRPO groups per optimizer step (episodes per step / ``num_generations``).
        metrics_path: Where each step's record (TRL's logs, the summary, ``seconds``) is appended as
            a JSON line; None keeps them in :attr:`rows` only.
        write: Where the line goes (``print``).
        on_step: Called with each record after it is written (e.g. to keep a curve).
        env_reward_key: Where TRL logs the environment's own reward (:data:`ENV_REWARD_KEY`; on the
            ``environment_factory`` route ``rewards/<environment class>/mean``).

    Attributes:
        rows: Every step's record so far.
    """

    def __init__(self, groups: int, metrics_path: str | Path | None = None, write: Callable[[str], Any] = print,
                 on_step: Callable[[dict[str, Any]], Any] | None = None, env_reward_key: str = ENV_REWARD_KEY):
        self.groups = groups
        self.env_reward_key = env_reward_key
        self.metrics_path = Path(metrics_path) if metrics_path is not None else None
        self.write = write
        self.on_step = on_step
        self.rows: list[dict[str, Any]] = []
        self.last = time.perf_counter()

    def restart_clock(self) -> None:
        """The next step's time starts now (after an evaluation between steps, say)."""
        self.last = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.restart_clock()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:  # the end-of-training summary has no reward
            return
        now = time.perf_counter()
        summary = step_summary(logs, self.groups, self.env_reward_key)
        row = {"step": state.global_step, "seconds": round(now - self.last, 2), **logs, "summary": summary}
        self.last = now
        self.rows.append(row)
        if self.metrics_path is not None:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            with self.metrics_path.open("a") as out:
                out.write(json.dumps(row) + "\n")
        self.write(step_line(state.global_step, state.max_steps or None, summary, row["seconds"]))
        if self.on_step is not None:
            self.on_step(row)
