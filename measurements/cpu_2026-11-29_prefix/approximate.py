"""Accuracy of the approximate prefix-cache mode on a bidirectional model: the shipped `embedded`
(LLaDA format) under the `prefix` cache, greedy threshold 0.9, gen 32, block 8, served by one
`Engine` (max batch 8, requests joining running batches) with the prefix cache off and with
approximate reuse in chunks of 2 tokens (so requests of one task share their `task :` prefix
chunk, K/V computed in another request's canvas). The same 12 tasks x 20 test prompts each
way; per-sample scores with the tasks' own scorers.

    OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-29_prefix/approximate.py OUT.json

Reports each arm's accuracy with a Wilson 95% interval, the paired difference with a
bootstrap 95% interval (10,000 resamples of the prompts, seed 0), answers that changed, and the
prompt tokens the approximate arm took from the store.
"""

import json
import math
import random
import sys
import time

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, Request
from dllm_decode.eval.bench.subject import load_subject, task_samples
from dllm_decode.registry import component

PER_TASK, CHUNK = 20, 2


def serve(model, tokenizer, prompts, config, approximate):
    engine = Engine(model, tokenizer, max_batch_size=8, prefix_cache_bytes=64 << 20 if approximate else 0,
                    prefix_cache_approximate=CHUNK if approximate else 0)
    for i, prompt in enumerate(prompts):
        engine.add(Request(str(i), tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"]), config))
    outputs = {}
    while engine.has_work:
        for update in engine.step():
            if update.output is not None:
                outputs[int(update.request_id)] = update.output
    stats = engine.prefix.stats().to_dict() if engine.prefix is not None else None
    return [outputs[i] for i in range(len(prompts))], stats


def wilson(k, n, z=1.96):
    p = k / n
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    return [round(100 * (centre - half), 2), round(100 * (centre + half), 2)]


def main(out_path):
    torch.set_num_threads(1)
    bench = load_subject("embedded")
    samples = task_samples(bench.tasks, PER_TASK, seed=0)
    config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.9}),
                          cache=component("cache", "prefix"), gen_length=32, block_length=8)
    prompts = [s.prompt for s in samples]
    arms = {}
    for name, approximate in (("off", False), ("approximate", True)):
        started = time.perf_counter()
        outputs, stats = serve(bench.model, bench.tokenizer, prompts, config, approximate)
        scores = [bench.tasks[s.task].score(s.example, o.text) for s, o in zip(samples, outputs)]
        arms[name] = {"scores": scores, "texts": [o.text for o in outputs], "store": stats,
                      "cached_tokens": sum(o.cached_tokens for o in outputs),
                      "seconds": round(time.perf_counter() - started, 2)}
    n = len(samples)
    off, approx = arms["off"]["scores"], arms["approximate"]["scores"]
    rng = random.Random(0)
    diffs = sorted(sum(approx[i] - off[i] for i in idx) / n * 100
                   for idx in ([rng.randrange(n) for _ in range(n)] for _ in range(10000)))
    report = {
        "model": "embedded", "cache": "prefix", "chunk": CHUNK, "samples": n, "per_task": PER_TASK,
        "config": config.to_dict(),
        "accuracy_off": round(100 * sum(off) / n, 2), "interval_off": wilson(sum(off), n),
        "accuracy_approximate": round(100 * sum(approx) / n, 2), "interval_approximate": wilson(sum(approx), n),
        "difference": round(100 * (sum(approx) - sum(off)) / n, 2),
        "interval": [round(diffs[249], 2), round(diffs[9749], 2)],
        "answers_changed": sum(a != b for a, b in zip(arms["off"]["texts"], arms["approximate"]["texts"])),
        "cached_tokens": arms["approximate"]["cached_tokens"], "store": arms["approximate"]["store"],
        "per_task_off": {}, "per_task_approximate": {},
        "command": "OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-29_prefix/approximate.py "
                   "measurements/cpu_2026-11-29_prefix/approximate.json",
    }
    for task in sorted(bench.tasks):
        idx = [i for i, s in enumerate(samples) if s.task == task]
        report["per_task_off"][task] = round(100 * sum(off[i] for i in idx) / len(idx), 1)
        report["per_task_approximate"][task] = round(100 * sum(approx[i] for i in idx) / len(idx), 1)
    with open(out_path, "w") as handle:
        json.dump(report, handle, indent=1)
    print(json.dumps({k: v for k, v in report.items() if not k.startswith("per_task") and k != "config"}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
