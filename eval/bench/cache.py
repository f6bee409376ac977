"""Benchmark the block KV caches side by side: `none` vs `prefix` vs `dual` in one run.

    python -m dllm_decode.eval.bench.cache [--json FILE] [--repeats 3] [--gen 256 512] [--batch 1 8]

Setting (Fast-dLLM's published LLaDA runs, spec §4.7): block 32, the `threshold` scheduler at 0.9,
greedy. Every configuration (generation length x batch size) runs each cache `--repeats` times,
interleaved (a rotating order inside each repeat, so load drifts on a shared machine hit every
cache alike); the figures are medians, and the speedups are ratios of those medians. Model: the
embedded model when it is installed, else a random-weight LLaDA of the same size (labelled as
such: a random model commits about one token per step, so its NFE is not a trained model's).
Prompts and accuracy come from the task suite (`dllm_decode.eval.tasks`) when the embedded model is used.
"""

from __future__ import annotations

import dataclasses
import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from dllm_decode.caches import CACHES
from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import Cache
from dllm_decode.models.layers import KVCache
from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM
from dllm_decode.models import ModelLoadError, load_model
from dllm_decode.prompts import encode_prompts, left_pad
from dllm_decode.modelspec import parse_options
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.schedulers import ThresholdScheduler

CACHE_NAMES = ("none", "prefix", "dual")
"""Compared in every run; `--variant` adds configured ones (e.g. `dual:prefix_look=1024`)."""
BLOCK, THRESHOLD = 32, 0.9
FALLBACK_SIZE = dict(d_model=256, n_heads=8, n_layers=4, mlp_hidden_size=704)
"""The embedded model's architecture (eval/training/dllm.py), used with random weights."""
ACCURACY_TASKS = ("sort", "reverse", "copy", "shuffle", "insert_index", "remove_index")


@dataclass
class Bench:
    model: Any
    label: str
    tasks: dict | None        # TASKS when the embedded model and the suite are both present


def load_bench_model(name: str = "embedded") -> Bench:
    """The named model (+ tasks when it speaks the task vocabulary), else a random LLaDA of the
    embedded size when the embedded model is not installed."""
    try:
        model = load_model(name)
    except ModelLoadError:
        if name != "embedded":
            raise
        generator = torch.Generator().manual_seed(0)
        config = LLaDAConfig(**FALLBACK_SIZE, vocab_size=128, max_sequence_length=1024,
                             rope_theta=10000.0, mask_token_id=127, eos_token_id=126, pad_token_id=126)
        model = LLaDAModelLM(config)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05 if p.dim() > 1 else torch.ones(p.shape))
        return Bench(model.eval(), "RANDOM-WEIGHT LLaDA at the embedded size (embedded model not "
                                   "installed): d_model 256, 4 layers, vocab 128", None)
    try:
        from dllm_decode.eval.tasks import TASKS
    except ImportError:
        TASKS = None
    return Bench(model, f"{name} ({getattr(model, 'name_or_path', name)})", TASKS)


def task_examples(tasks: dict, n: int, seed: int = 0) -> list:
    """`n` test-split examples cycling over the list tasks that exist in the suite."""
    names = [t for t in ACCURACY_TASKS if t in tasks] or sorted(tasks)
    per_task = -(-n // len(names))
    pools = [tasks[name].examples("test", per_task, seed) for name in names]
    mixed = [pool[i] for i in range(per_task) for pool in pools]
    return mixed[:n]


def prompts_for(bench: Bench, batch: int) -> list:
    if bench.tasks is not None:
        return [e.prompt for e in task_examples(bench.tasks, batch)]
    generator = torch.Generator().manual_seed(1)
    lengths = [16 + (5 * i) % 9 for i in range(batch)]        # unequal: exercises left padding
    return [torch.randint(0, 120, (n,), generator=generator).tolist() for n in lengths]


def decode_config(gen: int, threshold: float = THRESHOLD, stop_at_eos: bool = True) -> DecodeConfig:
    return DecodeConfig(scheduler=ThresholdScheduler(threshold), gen_length=gen, block_length=BLOCK,
                        stop_at_eos=stop_at_eos)


def run_once(bench: Bench, prompts: list, config: DecodeConfig, cache: Cache) -> dict:
    started = time.perf_counter()
    result = generate(bench.model, prompts, dataclasses.replace(config, cache=cache))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "nfe": result.nfe.double().mean().item(),
            "tokens": result.tokens, "text": result.text}


def measure(bench: Bench, config: DecodeConfig, batch: int, repeats: int,
            caches: dict[str, Cache]) -> list[dict]:
    """Median seconds and NFE per cache for one configuration, caches interleaved per repeat."""
    prompts = prompts_for(bench, batch)
    names = list(caches)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            runs[name].append(run_once(bench, prompts, config, caches[name]))
    base = statistics.median(r["seconds"] for r in runs["none"])
    rows = []
    for name in names:
        seconds = statistics.median(r["seconds"] for r in runs[name])
        same = torch.equal(runs[name][0]["tokens"], runs["none"][0]["tokens"])
        rows.append({"gen": config.gen_length, "batch": batch, "cache": name,
                     "seconds_per_sample": seconds / batch,
                     "tokens_per_second": config.gen_length * batch / seconds,
                     "nfe": runs[name][0]["nfe"], "speedup": base / seconds,
                     "same_tokens_as_none": same, "repeats": repeats})
    return rows


def forward_costs(bench: Bench, gen: int, batch: int, repeats: int = 5) -> dict[str, float]:
    """Median milliseconds of one forward at the first block: full (a refresh, or `none`), a
    prefix-cached step (rows [s, L)) and a dual-cached step (rows [s, s + 32)): the ceiling
    any step mix can reach."""
    ids = encode_prompts(prompts_for(bench, batch), getattr(bench.model, "tokenizer", None))
    canvas, mask = left_pad(ids, gen, bench.model.mask_token_id, bench.model.eos_token_ids[0],
                            torch.device("cpu"))
    start, length = canvas.shape[1] - gen, canvas.shape[1]
    kv = KVCache()
    with torch.inference_mode():
        bench.model(canvas, mask, kv=kv, rows=(start, length))
        calls = {"full": lambda: bench.model(canvas, mask, rows=(start, length)),
                 "prefix": lambda: bench.model(canvas, mask, kv=kv, rows=(start, length)),
                 "dual": lambda: bench.model(canvas, mask, kv=kv, rows=(start, start + BLOCK))}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(repeats):
            for name, call in calls.items():
                started = time.perf_counter()
                call()
                times[name].append(1000 * (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in times.items()}


def accuracy(bench: Bench, n: int, config: DecodeConfig, batch: int,
             caches: dict[str, Cache]) -> dict[str, dict]:
    """Task accuracy (%) per cache on `n` test examples, and agreement with `none`'s outputs."""
    examples = task_examples(bench.tasks, n)
    texts: dict[str, list[str]] = {}
    for name, cache in caches.items():
        texts[name] = []
        for start in range(0, n, batch):
            chunk = examples[start:start + batch]
            texts[name] += run_once(bench, [e.prompt for e in chunk], config, cache)["text"]
    out = {}
    for name in caches:
        scores = [bench.tasks[e.task].score(e, t) for e, t in zip(examples, texts[name])]
        agree = sum(a == b for a, b in zip(texts[name], texts["none"]))
        out[name] = {"accuracy": 100 * sum(scores) / n, "agreement_with_none": 100 * agree / n}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", dest="json_path", help="also write the results here")
    parser.add_argument("--model", default="embedded",
                        help="a model directory trained on the task suite (default: the embedded model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gen", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: stable on a shared 2-core machine)")
    parser.add_argument("--stop-at-eos", action=argparse.BooleanOptionalAction, default=True,
                        help="stop a row after the block holding its end-of-text (the loop default)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD,
                        help="of the threshold scheduler (1.0: about one token per step, long decodes)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="also compare this configured cache; repeatable")
    parser.add_argument("--accuracy-samples", type=int, default=48)
    parser.add_argument("--accuracy-gen", type=int, default=256)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = load_bench_model(args.model)
    configs = {gen: decode_config(gen, args.threshold, args.stop_at_eos)
               for gen in {*args.gen, args.accuracy_gen}}
    print(f"model: {bench.label}; block {BLOCK}, threshold {args.threshold}, threads {args.threads}, "
          f"stop_at_eos {args.stop_at_eos}, median of {args.repeats} interleaved repeats")
    caches = {name: CACHES[name]() for name in CACHE_NAMES}
    for spec in args.variant:
        name, _, options = spec.partition(":")
        caches[spec] = component("cache", {"name": name, **dict(parse_options(options))})
    run_once(bench, prompts_for(bench, 1), decode_config(64), caches["dual"])        # warm-up
    rows = []
    header = f"{'gen':>4} {'B':>2} {'s/sample':>9} {'tok/s':>8} {'NFE':>6} {'speedup':>8} {'=none':>5}  cache"
    print(header)
    for gen in args.gen:
        for batch in args.batch:
            costs = forward_costs(bench, gen, batch)
            print(f"{gen:>4} {batch:>2} one forward at the first block: full {costs['full']:.1f} ms, "
                  f"prefix {costs['prefix']:.1f} ms ({costs['full'] / costs['prefix']:.2f}x), "
                  f"dual {costs['dual']:.1f} ms ({costs['full'] / costs['dual']:.2f}x)", flush=True)
            for row in measure(bench, configs[gen], batch, args.repeats, caches):
                rows.append({**row, "forward_ms": costs})
                print(f"{row['gen']:>4} {row['batch']:>2} {row['seconds_per_sample']:>9.3f} "
                      f"{row['tokens_per_second']:>8.1f} {row['nfe']:>6.1f} {row['speedup']:>7.2f}x "
                      f"{str(row['same_tokens_as_none']):>5}  {row['cache']}", flush=True)
    acc = None
    if bench.tasks is not None and args.accuracy_samples > 0:
        acc = accuracy(bench, args.accuracy_samples, configs[args.accuracy_gen], max(args.batch),
                       caches)
        print(f"accuracy on {args.accuracy_samples} test examples (gen {args.accuracy_gen}):")
        for name, values in acc.items():
            print(f"  {values['accuracy']:5.1f}%  (same output as none: "
                  f"{values['agreement_with_none']:5.1f}%)  {name}")
    else:
        print("accuracy: not measured (needs the embedded model and dllm_decode.eval.tasks)")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"model": bench.label, "block_length": BLOCK, "threshold": args.threshold,
                       "threads": args.threads, "stop_at_eos": args.stop_at_eos, "rows": rows,
                       "accuracy": acc}, f, indent=2)


if __name__ == "__main__":
    main()
