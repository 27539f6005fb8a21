"""The local model's weight dtypes side by side: float32, bfloat16 and int8 (``policies/int8.py``).

Question: what does each dtype buy one decoding step, one conversation decoding alone, and a
full batch, and how far do its log-probabilities move from float32's?

Five measurements, each dtype in turn in one process (the embedded SmolLM2-135M-Instruct on the CPU):

1. one linear layer the size of the model's MLP projections (576 -> 1,536) on 1, 16 and 600
   tokens: float32, bfloat16, and the int8 kernel ``Int8Linear`` uses (weights in cache, so this
   is the arithmetic, not the memory traffic);
2. every linear layer of one decoding step of 1 to 32 rows, weights streamed from memory (30
   layers of distinct weights and the output head): ``nn.functional.linear`` against oneDNN's
   packed layout (``policies/packed.py``), float32 and bfloat16;
3. one layer's attention for one decoding step: transformers' SDPA path against
   ``policies/attention.py``'s, one row alone and 8 rows with a padding mask;
4. plain transformers ``generate``, greedy, one prompt, ``--tokens`` tokens: tokens/s, and the
   mean absolute difference of each token's log-probability from float32's on float32's own
   continuation, computed as decoding computes it (the prompt prefilled, then a token a step);
5. the engine (``LocalPolicy``: the running batch, prefix cache off): one prompt alone, then 16
   prompts at once, ``--tokens`` tokens each; each dtype in a fresh process that loads the model
   in a thread, as ``nemo-gym-env rollouts`` does (a process whose main thread also ran torch
   has two OpenMP thread teams on the cores, which changes how they wait), under the
   environment's OpenMP settings (``OMP_WAIT_POLICY=PASSIVE python benchmarks/local_dtypes.py``
   for the other choice).

Usage::

    python benchmarks/local_dtypes.py                 # about 3 minutes on 2 cores
    python benchmarks/local_dtypes.py --tokens 32 --dtypes bfloat16 int8
    python benchmarks/local_dtypes.py --dtypes bfloat16 bfloat16:plain   # the engine with and without packed weights

Writes ``benchmarks/results/local_dtypes.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

PROMPTS = ["Write a short story about a robot learning to paint.", "What is 17 times 23? Answer with the number.",
           "Name three capitals in Europe and say one thing about each."]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"],
                        help="float32, bfloat16, int8; DTYPE:plain for the engine without packed weights")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per prompt")
    parser.add_argument("--out", type=Path, default=harness.RESULTS_DIR)
    parser.add_argument("--name", default="local_dtypes")
    parser.add_argument("--engine-only", metavar="DTYPE", help=argparse.SUPPRESS)  # the child of engine()
    return parser.parse_args(argv)


def linear_layer(dtypes: list[str]) -> list[dict[str, Any]]:
    import torch

    from nemo_gym_env.policies.int8 import Int8Linear

    layer = torch.nn.Linear(576, 1536, bias=False)
    bf16 = torch.nn.Linear(576, 1536, bias=False).to(torch.bfloat16)
    bf16.weight = torch.nn.Parameter(layer.weight.detach().to(torch.bfloat16), requires_grad=False)
    int8 = Int8Linear(bf16, small_batch=1 << 30)
    rows = []
    for tokens in (1, 16, 600):
        x = torch.randn(tokens, 576)
        half = x.bfloat16()
        calls = {"float32": lambda x=x: layer(x), "bfloat16": lambda half=half: bf16(half),
                 "int8": lambda half=half: int8(half)}
        for dtype in dtypes:
            call = calls.get(dtype)
            if call is None:
                continue
            with torch.inference_mode():
                for _ in range(5):
                    call()
                repeats = 200 if tokens < 600 else 40
                started = time.perf_counter()
                for _ in range(repeats):
                    call()
                rows.append({"tokens": tokens, "dtype": dtype,
                             "microseconds": (time.perf_counter() - started) / repeats * 1e6})
    return rows


def packed_linear(dtypes: list[str]) -> list[dict[str, Any]]:
    """Every linear layer of SmolLM2-135M for one decoding step of 1 to 32 rows, weights streamed from memory (30
    layers' worth of distinct random weights and the output head, as a step reads them): ``nn.functional.linear``
    against oneDNN's packed layout (``policies/packed.py``), and the largest difference between their outputs."""
    import torch

    from nemo_gym_env.policies.packed import PackedLinear, supports_packed

    shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # q k v o gate up down
    rows = []
    for dtype in [d for d in dtypes if d in ("float32", "bfloat16")]:
        kind = getattr(torch, dtype)
        if not supports_packed(kind):
            continue
        generator = torch.Generator().manual_seed(0)
        plain = [torch.nn.Linear(columns, out, bias=False).to(kind) for _ in range(30) for out, columns in shapes]
        plain.append(torch.nn.Linear(576, 49152, bias=False).to(kind))
        packed = [PackedLinear(layer) for layer in plain]
        for count in (1, 8, 16, 32):
            inputs = {size: torch.randn(count, size, generator=generator).to(kind) for size in (576, 1536)}
            difference = 0.0
            times = {}
            with torch.inference_mode():
                for name, layers in (("nn.functional.linear", plain), ("packed", packed)):
                    run = lambda layers=layers: [layer(inputs[layer.in_features]) for layer in layers]
                    run()
                    started = time.perf_counter()
                    for _ in range(10):
                        run()
                    times[name] = (time.perf_counter() - started) / 10 * 1000
                for a, b in zip(plain[:7], packed[:7]):
                    x = inputs[a.in_features]
                    difference = max(difference, (a(x).float() - b(x).float()).abs().max().item())
            for name, milliseconds in times.items():
                rows.append({"dtype": dtype, "rows": count, "layers": name, "milliseconds": milliseconds,
                             "largest_difference": difference})
    return rows


def attention_step(dtypes: list[str]) -> list[dict[str, Any]]:
    """One layer's attention for one decoding step (SmolLM2's 9 query heads on 3 key/value heads, 550 cached
    positions): transformers' SDPA path and ``policies/attention.py``'s, rows alone (no padding mask) and 8
    rows of different lengths (a padding mask)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from nemo_gym_env.policies.attention import decode_attention

    class Layer:
        num_key_value_groups = 3
        is_causal = True

    rows = []
    for dtype in [d for d in dtypes if d in ("float32", "bfloat16")]:
        for batch, padded in ((1, False), (8, True)):
            torch.manual_seed(0)
            kind = getattr(torch, dtype)
            query = torch.randn(batch, 9, 1, 64, dtype=kind)
            key = torch.randn(batch, 3, 800, 64, dtype=kind)[:, :, :550]  # views of larger buffers, as the cache's
            value = torch.randn(batch, 3, 800, 64, dtype=kind)[:, :, :550]
            mask = None
            if padded:
                mask = torch.ones(batch, 1, 1, 550, dtype=torch.bool)
                for row in range(batch):
                    mask[row, ..., : 40 * row] = False
            for name, call in (("transformers sdpa", sdpa_attention_forward), ("decode_attention", decode_attention)):
                with torch.inference_mode():
                    for _ in range(10):
                        call(Layer(), query, key, value, mask)
                    started = time.perf_counter()
                    for _ in range(300):
                        call(Layer(), query, key, value, mask)
                rows.append({"dtype": dtype, "rows": batch, "padding_mask": padded, "path": name,
                             "microseconds": (time.perf_counter() - started) / 300 * 1e6})
    return rows


def _load(dtype: str, tokens: int = 1) -> Any:
    """``DTYPE`` (weights packed, as LocalPolicy loads them) or ``DTYPE:plain`` (transformers' own linear layers)."""
    from nemo_gym_env.policies.local import LocalPolicy

    kind, _, layers = dtype.partition(":")
    return LocalPolicy(dtype=kind, temperature=0, max_new_tokens=tokens, prefix_cache_mb=0,
                       packed_weights=layers != "plain")


def plain_generate(dtypes: list[str], tokens: int) -> list[dict[str, Any]]:
    import torch

    reference = _load("float32:plain")
    tokenizer = reference.tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)["input_ids"] for p in PROMPTS]
    rows = []
    with torch.inference_mode():
        continuations = [reference.model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
                         for ids in prompts]
        reference_logps = [_token_logps(reference.model, full, ids.shape[1]) for ids, full in zip(prompts, continuations)]
    reference.close()
    for dtype in dtypes:
        policy = _load(dtype)
        model = policy.model
        with torch.inference_mode():
            model.generate(prompts[0], max_new_tokens=4, do_sample=False)
            speeds, moved = [], []
            for ids, full, ref in zip(prompts, continuations, reference_logps):
                started = time.perf_counter()
                model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
                speeds.append(tokens / (time.perf_counter() - started))
                moved.append(float((_token_logps(model, full, ids.shape[1]) - ref).abs().mean()))
        rows.append({"dtype": dtype, "tokens_per_s": statistics.median(speeds),
                     "logprob_shift_from_float32": statistics.mean(moved)})
        policy.close()
    return rows


def _token_logps(model: Any, full: Any, start: int) -> Any:
    """Log-probabilities of ``full[start:]`` as decoding computes them: the prompt prefilled, then one token a step."""
    import torch

    out = model(full[:, :start], use_cache=True)
    logps = []
    for position in range(start, full.shape[1]):
        logps.append(torch.log_softmax(out.logits[0, -1].float(), dim=-1)[full[0, position]])
        out = model(full[:, position: position + 1], past_key_values=out.past_key_values, use_cache=True)
    return torch.stack(logps)


def engine(dtypes: list[str], tokens: int) -> list[dict[str, Any]]:
    """Each dtype in a fresh process (see the module docstring)."""
    rows = []
    for dtype in dtypes:
        done = subprocess.run([sys.executable, __file__, "--engine-only", dtype, "--tokens", str(tokens)],
                              capture_output=True, text=True, check=True, timeout=900)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def engine_in_this_process(dtypes: list[str], tokens: int) -> list[dict[str, Any]]:
    import threading

    from nemo_gym_env.client.loop import background_loop
    from nemo_gym_env.policies import PolicyRequest
    from nemo_gym_env.policies.local import LocalPolicy

    topics = ["a robot", "the sea", "a cat", "mountains", "a king", "the moon", "trains", "a river", "bread", "snow",
              "a city", "a violin", "bees", "a lighthouse", "maps", "a clock"]
    requests = [PolicyRequest(input=[{"role": "user", "content": f"Tell me a long story about {t}."}], history=[],
                              tools=[]) for t in topics]
    rows = []
    for dtype in dtypes:
        loaded: list[LocalPolicy] = []
        loader = threading.Thread(target=lambda d=dtype, loaded=loaded: loaded.append(_load(d, tokens)))
        loader.start()
        loader.join()
        policy = loaded[0]

        async def together(*batch: PolicyRequest, policy: LocalPolicy = policy) -> list[Any]:
            return await asyncio.gather(*(policy.generate(r) for r in batch))

        run = lambda *batch: background_loop().run(together(*batch), timeout=600)
        run(requests[0])  # warm-up
        singles = []
        for request in requests[:3]:
            started = time.perf_counter()
            (turn,) = run(request)
            singles.append(turn.output_tokens / (time.perf_counter() - started))
        started = time.perf_counter()
        turns = run(*requests)
        seconds = time.perf_counter() - started
        rows.append({"dtype": dtype, "one_prompt_tokens_per_s": statistics.median(singles),
                     "sixteen_prompts_tokens_per_s": sum(t.output_tokens for t in turns) / seconds})
        policy.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.engine_only:
        print(json.dumps(engine_in_this_process([args.engine_only], args.tokens)[0]))
        return 0
    openmp = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    machine = harness.machine()
    layer = linear_layer(args.dtypes)
    harness.print_table(["tokens", "dtype", "us"], [[r["tokens"], r["dtype"], r["microseconds"]] for r in layer],
                        title="one 576 x 1,536 linear layer")
    packed = packed_linear(args.dtypes)
    harness.print_table(["dtype", "rows", "layers", "ms", "largest difference"],
                        [[r["dtype"], r["rows"], r["layers"], r["milliseconds"], r["largest_difference"]] for r in packed],
                        title="every linear layer of one decoding step, weights from memory")
    attention = attention_step(args.dtypes)
    harness.print_table(["dtype", "rows", "padding mask", "path", "us"],
                        [[r["dtype"], r["rows"], r["padding_mask"], r["path"], r["microseconds"]] for r in attention],
                        title="one layer's attention, one decoding step over 550 cached positions")
    plain = plain_generate(args.dtypes, args.tokens)
    harness.print_table(["dtype", "tokens/s", "log-prob shift from float32 (nats/token)"],
                        [[r["dtype"], r["tokens_per_s"], r["logprob_shift_from_float32"]] for r in plain],
                        title=f"transformers generate, one prompt, {args.tokens} tokens (median of {len(PROMPTS)})")
    ours = engine(args.dtypes, args.tokens)
    harness.print_table(["dtype", "one prompt tokens/s", "16 prompts tokens/s"],
                        [[r["dtype"], r["one_prompt_tokens_per_s"], r["sixteen_prompts_tokens_per_s"]] for r in ours],
                        title=f"the engine (LocalPolicy), {args.tokens} tokens a prompt")
    path = harness.write_results(args.name, {"machine": machine, "tokens": args.tokens,
                                             "openmp_env_at_start": openmp,
                                             "linear_layer": layer, "packed_linear": packed, "attention_step": attention, "plain_generate": plain,
                                             "engine": ours},
                                 args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
