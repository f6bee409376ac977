"""Compiled (inductor) captured step vs the eager loop, tokens/s on the CPU.

The configuration (greedy threshold, cache none or dual) runs the fused step: forward, decision
and write in one compiled graph per bucket, one status read per step.

Run: OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-27b/capture/measure.py
Per (model, batch): one warm-up decode per variant (the compile is paid there, excluded), then
RUNS interleaved repeats eager / compiled; tokens/s = generated tokens / wall seconds.
"""

from __future__ import annotations

import json
import platform
import sys
import time

import torch

from dllm_decode.capture import GraphCache
from dllm_decode.config import DecodeConfig
from dllm_decode.modelspec import ModelSpec, load_diffusion
from dllm_decode.sampler import generate
from dllm_decode.schedulers import ThresholdScheduler
from dllm_decode.testing import tiny_llada

RUNS = 3
torch.set_num_threads(1)
models = {"embedded": load_diffusion(ModelSpec.parse("embedded")),
          "tiny_llada(layers=4, vocab 37)": tiny_llada(layers=4)}
from dllm_decode.caches import DualCache
from dllm_decode.interfaces import NoCache
configs = {"none": DecodeConfig(scheduler=ThresholdScheduler(0.9), gen_length=32, block_length=8),
           "dual": DecodeConfig(scheduler=ThresholdScheduler(0.9), cache=DualCache(), gen_length=32,
                                block_length=8)}
rows = []
for (name, model), (cache, config) in [(m, c) for m in models.items() for c in configs.items()]:
    for batch in (1, 8):
        prompts = [[5 + i % 20, 6, 7, 8, 9, 10, 11, 12][: 4 + i % 4] for i in range(batch)]
        graphs = GraphCache("compile")
        t0 = time.perf_counter()
        reference = generate(model, prompts, config)
        compiled = generate(model, prompts, config, capture=graphs)
        warm = time.perf_counter() - t0
        same = torch.equal(reference.tokens, compiled.tokens) and torch.equal(reference.nfe, compiled.nfe)
        times = {"eager": [], "compile": []}
        for _ in range(RUNS):
            for variant in ("eager", "compile"):
                start = time.perf_counter()
                result = generate(model, prompts, config, capture=graphs if variant == "compile" else "off")
                times[variant].append(time.perf_counter() - start)
        tokens = batch * config.gen_length
        ratios = [e / c for e, c in zip(times["eager"], times["compile"])]
        row = {"model": name, "cache": cache, "batch": batch, "identical_tokens_and_nfe": same,
               "nfe_max": int(reference.nfe.max()), "graphs": graphs.captures,
               "warmup_seconds_incl_compile": round(warm, 1),
               "eager_tokens_per_s": [round(tokens / t, 1) for t in times["eager"]],
               "compile_tokens_per_s": [round(tokens / t, 1) for t in times["compile"]],
               "speedup_compile_over_eager": [round(r, 3) for r in ratios]}
        rows.append(row)
        print(json.dumps(row), flush=True)
out = {"command": "OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-27b/capture/measure.py",
       "torch": torch.__version__, "python": sys.version.split()[0], "machine": platform.machine(),
       "threads": torch.get_num_threads(), "runs": RUNS,
       "config": "threshold 0.9, gen 32, block 8, prompts of 4-7 tokens", "rows": rows}
from dllm_decode.outputs import atomic_write
atomic_write("measurements/cpu_2026-11-27b/capture/results.json", json.dumps(out, indent=1) + "\n")
