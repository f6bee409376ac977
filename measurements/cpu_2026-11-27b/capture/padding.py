"""Where the compiled step loses at batch 8 on the embedded model: canvas padding (bucket of 64
vs 16 columns) and the static step without compilation, interleaved with eager.

Run: OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-27b/capture/padding.py
"""

from __future__ import annotations

import json
import time

import torch

from dllm_decode.capture import GraphCache
from dllm_decode.config import DecodeConfig
from dllm_decode.modelspec import ModelSpec, load_diffusion
from dllm_decode.outputs import atomic_write
from dllm_decode.sampler import generate
from dllm_decode.schedulers import ThresholdScheduler

RUNS = 3
torch.set_num_threads(1)
model = load_diffusion(ModelSpec.parse("embedded"))
config = DecodeConfig(scheduler=ThresholdScheduler(0.9), gen_length=32, block_length=8)
prompts = [[5 + i % 20, 6, 7, 8, 9, 10, 11, 12][: 4 + i % 4] for i in range(8)]
variants = {"eager": "off", "static/64": GraphCache("static"),
            "static/16": GraphCache("static", length_step=16),
            "compile/64": GraphCache("compile"), "compile/16": GraphCache("compile", length_step=16)}
reference = generate(model, prompts, config)
for name, capture in variants.items():          # warm-up: compiles paid here
    assert torch.equal(generate(model, prompts, config, capture=capture).tokens, reference.tokens)
times = {name: [] for name in variants}
for _ in range(RUNS):
    for name, capture in variants.items():
        start = time.perf_counter()
        generate(model, prompts, config, capture=capture)
        times[name].append(time.perf_counter() - start)
tokens = len(prompts) * config.gen_length
out = {"command": "OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-27b/capture/padding.py",
       "torch": torch.__version__, "runs": RUNS, "batch": 8, "canvas_columns": 39,
       "config": "embedded, threshold 0.9, cache none, gen 32, block 8",
       "tokens_per_s": {k: [round(tokens / t, 1) for t in v] for k, v in times.items()},
       "ratio_over_eager": {k: [round(e / t, 3) for e, t in zip(times["eager"], v)]
                            for k, v in times.items() if k != "eager"}}
print(json.dumps(out, indent=1))
atomic_write("measurements/cpu_2026-11-27b/capture/padding.json", json.dumps(out, indent=1) + "\n")
