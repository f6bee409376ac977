"""One cached in-block step of the embedded model (batch 8, a 40-column prompt, gen 256, block
32, the step after the block's first), timed per cache, the caches interleaved: `dual` (the fused
forward of the block rows), `es` with no skip layer (the same step on the layer-by-layer path of
`caches/layerwise.py`) and `es` at its defaults (layers 2-3 on a quarter of the block). Prints
each repeat's milliseconds and the median, min and max ratios. Run from the repository root:
OMP_NUM_THREADS=1 python measurements/cpu_2026-11-29-es/step_cost.py [REPEATS]."""

import statistics
import sys
import time

import torch

from dllm_decode.caches import DualCache, EarlySkipCache
from dllm_decode.models import load_model

torch.manual_seed(0)
model = load_model("embedded", dtype="float32")
prompt, gen, block = 40, 256, (40, 72)
canvas = torch.randint(4, 100, (8, prompt + gen))
canvas[:, prompt:] = model.mask_token_id
caches = {"dual": DualCache(), "es 1@0": EarlySkipCache(proportions="1@0", suffix="refresh"),
          "es": EarlySkipCache()}
states = {}
with torch.inference_mode():
    for name, cache in caches.items():           # the block's first step fills the cache
        _, _, states[name] = cache.logits(model, canvas.clone(), None, block, 0, cache.init_state(model))
    step = canvas.clone()
    step[:, 40:42] = 7                            # two commits, then the timed step (block step 1)
    times = {name: [] for name in caches}
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
        for name, cache in caches.items():
            state = cache.select_rows(states[name], torch.arange(8))      # a copy: every repeat alike
            start = time.perf_counter()
            cache.logits(model, step, None, block, 1, state)
            times[name].append(1000 * (time.perf_counter() - start))
for name, ms in times.items():
    ratios = [d / t for d, t in zip(times["dual"], ms)]
    print(f"{name:8s} median {statistics.median(ms):7.2f} ms  dual/this: median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
