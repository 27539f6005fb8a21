"""``recipes/trl_grpo.py`` run as a user runs it (slow: loads the model, trains).

The training is shared: one real run per route for the whole session (:func:`rollout_func_run`,
:func:`environment_factory_run`, the quick start's settings with a short budget: one group of 4
episodes a step, 96 tokens an episode, a held-out set of one row of each kind), and every
assertion about the recipe reads what those runs left: their output, metrics, held-out records,
curves and checkpoints.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("trl")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("trl-recipe-runs")]

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "trl_grpo.py"
OTHER = {"task": "other", "model": "m", "seed": 1, "route": "rollout_func", "name": None, "before": 0.0, "after": 0.5}


@dataclass
class Run:
    done: subprocess.CompletedProcess
    out: Path
    results: Path
    heldout: list[dict]

    @property
    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.out / "metrics.jsonl").read_text().splitlines()]

    @property
    def record(self) -> dict:
        return json.loads(self.results.read_text())["runs"][-1]


def _heldout(tmp: Path, size: int, answer_tool: bool = False) -> tuple[Path, list[dict]]:
    from nemo_gym_env.servers.badge_lookup.make_dataset import make_dataset

    rows = make_dataset(size, seed=0, split="heldout", answer_tool=answer_tool)
    path = tmp / "heldout.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path, rows


def _run(tmp: Path, *overrides: str, heldout_size: int = 2, answer_tool: bool = False) -> Run:
    from nemo_gym_env.policies.models import DEFAULT_MODEL_NAME

    heldout, rows = _heldout(tmp, heldout_size, answer_tool)
    out, results = tmp / "run", tmp / "results" / "heldout.json"
    results.parent.mkdir()
    route = next((o.split("=", 1)[1] for o in overrides if o.startswith("route=")), "rollout_func")
    earlier = {**OTHER, "task": "badge_lookup", "model": DEFAULT_MODEL_NAME, "seed": 0, "route": route,
               "before": 7.0, "after": 7.0}
    results.write_text(json.dumps({"runs": [OTHER, earlier]}))
    command = [sys.executable, str(RECIPE), f"eval_dataset={heldout}", "eval_every=1", f"results={results}",
               f"output_dir={out}", f"plot={out / 'curves.png'}", "max_completion_length=96", *overrides]
    done = subprocess.run(command, check=False, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=1700)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return Run(done, out, results, rows)


@pytest.fixture(scope="session")
def rollout_func_run(tmp_path_factory, model_dir) -> Run:
    """The quick start's defaults (badge_lookup, single questions) on a short budget: 2 steps of one group of 4
    episodes, partial credit for lookups as shaping, a held-out evaluation after every step."""
    return _run(tmp_path_factory.mktemp("rollout_func"), "steps=2", "num_generations=4", "batch_size=4",
                "shaping={looked_up: 0.5}")


@pytest.fixture(scope="session")
def environment_factory_run(tmp_path_factory, model_dir) -> Run:
    """The same through TRL's tool loop: the rows answer with submit_answer, the reward is the server's."""
    return _run(tmp_path_factory.mktemp("environment_factory"), "route=environment_factory", "steps=1",
                "num_generations=4", "batch_size=4", "micro_batch_size=4", "shaping={answered: 0.5}",
                answer_tool=True)


def test_each_step_prints_one_line_with_its_reward_spread_and_learning_signal(rollout_func_run):
    lines = [line for line in rollout_func_run.done.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"]
    metrics = rollout_func_run.metrics
    assert [m["step"] for m in metrics] == [1, 2]
    for line, step in zip(lines, metrics):
        summary = step["summary"]
        assert summary["groups"] == 1 and step["env/failed"] == 0.0
        assert f"reward {step['reward']:.3f} ± {step['reward_std']:.3f}" in line
        assert f"signal in {summary['groups_with_signal']}/1 groups" in line
        assert f"env reward {summary['env_reward']:.3f}" in line or summary["env_reward"] == step["reward"]
        # A group whose episodes all scored the same teaches nothing: TRL's gradient is 0 then, and the line says so.
        if summary["groups_with_signal"] == 0:
            assert step["grad_norm"] == 0.0
        else:
            assert step["grad_norm"] > 0.0
    output = rollout_func_run.done.stdout
    assert output.count("no group carried a learning signal") == sum(
        m["summary"]["groups_with_signal"] == 0 for m in metrics)
    assert "{'loss'" not in output  # TRL's dicts are replaced by the line
    assert "mean reward: first 1 steps" in output  # the run's summary line
    # Activation checkpointing is on by default, through TRL's current setting (no deprecation warning).
    assert "`gradient_checkpointing` is deprecated" not in rollout_func_run.done.stderr
    assert f"{sum(m['summary']['groups_with_signal'] > 0 for m in metrics)} of 2 steps had a learning signal" in output


def test_shaping_adds_a_weighted_reward_and_the_env_reward_stays_the_servers(rollout_func_run):
    for step in rollout_func_run.metrics:
        shaped, own = step["rewards/metric_looked_up/mean"], step["rewards/env_reward/mean"]
        assert step["reward"] == pytest.approx(own + 0.5 * shaped, abs=1e-4)
        assert step["summary"]["env_reward"] == own
    assert rollout_func_run.record["settings"]["shaping"] == {"looked_up": 0.5}


def test_held_out_rows_are_scored_greedy_by_kind_before_between_and_after(rollout_func_run):
    run, out = rollout_func_run, rollout_func_run.out
    runs = json.loads(run.results.read_text())["runs"]
    assert runs[0] == OTHER and len(runs) == 2  # the earlier record of this run (before 7.0) replaced
    record = run.record
    assert {k: record[k] for k in ("task", "seed", "steps", "train_rows", "heldout_rows", "route")} == {
        "task": "badge_lookup", "seed": 0, "steps": 2, "train_rows": 512, "heldout_rows": 2, "route": "rollout_func"}
    assert [e["step"] for e in record["evals"]] == [0, 1, 2] and all(e["failed"] == 0 for e in record["evals"])
    for evaluation in record["evals"]:
        assert set(evaluation["by_kind"]) == {"single", "larger"}  # the held-out rows take turns between kinds
        assert evaluation["reward"] == pytest.approx(sum(evaluation["by_kind"].values()) / 2, abs=1e-4)
    assert record["before"] == record["evals"][0]["reward"] and record["after"] == record["evals"][-1]["reward"]
    assert 0.0 <= record["before"] <= 1.0 and 0.0 <= record["after"] <= 1.0
    assert record["by_kind"] == {"before": record["evals"][0]["by_kind"], "after": record["evals"][-1]["by_kind"]}
    assert len(record["train_reward"]) == 2 and record["steps_with_signal"] in (0, 1, 2)
    for moment in ("at_start", "at_end"):
        assert record["machine"][moment]["load_avg_1m"] >= 0 and isinstance(record["machine"][moment]["cpu_flags"], list)
    assert (out / "heldout" / "model" / "config.json").exists()  # the trained model the last evaluation loaded
    rows = [json.loads(line) for line in (out / "heldout" / "heldout_step2.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["responses_create_params"]["temperature"] == 0.0 for r in rows)  # greedy
    assert {r["kind"] for r in rows} == {"single", "larger"}
    assert "held-out reward: before" in run.done.stdout
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "curves.png").stat().st_size > 0


def test_the_environment_factory_route_trains_on_tool_calls_and_submitted_answers(environment_factory_run):
    run = environment_factory_run
    assert "using TRL's Qwen2.5 template" in run.done.stdout
    (step,) = run.metrics
    assert step["step"] == 1 and step["summary"]["groups"] == 1
    reward_keys = sorted(k for k in step if k.startswith("rewards/") and k.endswith("/mean"))
    # The environment's own reward (its get_reward, /verify) and the shaping read from its verdict.
    assert reward_keys == ["rewards/Badge_lookupEnvironment/mean", "rewards/metric_answered/mean"]
    own, answered = step["rewards/Badge_lookupEnvironment/mean"], step["rewards/metric_answered/mean"]
    assert step["reward"] == pytest.approx(own + 0.5 * answered, abs=1e-4) and 0.0 <= own <= answered
    assert step["summary"]["env_reward"] is not None
    record = run.record
    assert record["route"] == "environment_factory" and [e["step"] for e in record["evals"]] == [0, 1]
    # The held-out model carries the template it was trained with, so the evaluation renders the tools the same way.
    saved = json.loads((run.out / "heldout" / "model" / "tokenizer_config.json").read_text())
    assert "<tools>" in (saved.get("chat_template") or (run.out / "heldout" / "model" / "chat_template.jinja").read_text())


def test_recipe_refuses_held_out_rows_that_are_training_rows(tmp_path):
    from nemo_gym_env.servers.badge_lookup.make_dataset import make_dataset

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in make_dataset(4, seed=0, split="train")))
    command = [sys.executable, str(RECIPE), f"dataset={train}", f"eval_dataset={train}",
               f"output_dir={tmp_path / 'run'}"]
    done = subprocess.run(command, check=False, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
    assert done.returncode != 0
    assert "4 of the 4 held-out rows are also training rows" in done.stderr


@pytest.mark.parametrize("overrides, message", [
    (["route=tools"], "route must be one of"),
    (["dtype=int4"], "dtype must be one of"),
    (["shaping=[looked_up]"], "shaping must map numeric /verify fields to weights"),
    (["shaping={looked_up: lots}"], "shaping must map numeric /verify fields to weights"),
    (["batch_size=6"], "must be a multiple of micro_batch_size"),
    (["dataset={_target_: nemo_gym_env.servers.badge_lookup.make_dataset.make_dataset, size: 4, kinds: [sum]}"],
     "kinds must be some of"),
])
def test_settings_that_cannot_work_are_refused_before_anything_loads(tmp_path, overrides, message):
    done = subprocess.run([sys.executable, str(RECIPE), f"output_dir={tmp_path}", *overrides], check=False,
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode != 0 and message in done.stderr


def test_the_gpu_preset_composes_over_the_defaults(tmp_path):
    """``--config-name gpu_vllm`` (not run here: no GPU) is the defaults with the GPU settings on top."""
    import yaml

    done = subprocess.run([sys.executable, str(RECIPE), "--config-name", "gpu_vllm", "--cfg", "job"], check=False,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    config = yaml.safe_load(done.stdout)
    assert config["use_vllm"] is True and config["vllm_mode"] == "colocate" and config["dtype"] == "bfloat16"
    assert config["optim"] == "adamw_torch" and config["max_turn_tokens"] is None
    assert config["env"] == "NemoGym/badge_lookup-v0" and config["route"] == "rollout_func"  # the defaults beneath
