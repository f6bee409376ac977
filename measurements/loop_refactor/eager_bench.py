"""Eager decode timing for one checkout (the python that runs it picks the checkout): per
configuration the median of 7 timed decodes (after one warm-up) in process CPU time (the machine
is shared: CPU time is what this process spent, wall time is printed beside it), the tokens'
digest and the NFE. One thread."""
import hashlib
import json
import time

import torch

torch.set_num_threads(1)
import dllm_decode  # noqa: E402
from dllm_decode.caches import CACHES  # noqa: E402
from dllm_decode.config import DecodeConfig  # noqa: E402
from dllm_decode.models.loading import load_model  # noqa: E402
from dllm_decode.sampler import generate  # noqa: E402
from dllm_decode.schedulers import SCHEDULERS  # noqa: E402

model = load_model("embedded", dtype="float32")
tok = model.tokenizer
prompts = [tok.encode("sort : mia ella hank"), tok.encode("reverse : lucy eric kevin")]
out = {"where": dllm_decode.__file__}
for rule, cache, temp in (("low_confidence", "dual", 0.0), ("low_confidence", "none", 0.0),
                          ("threshold", "dual", 0.0), ("low_confidence", "dual", 0.7)):
    cfg = DecodeConfig(scheduler=SCHEDULERS[rule](), cache=CACHES[cache](), gen_length=32,
                       block_length=8, temperature=temp, seed=1, stop_at_eos=False)
    generate(model, prompts, cfg)
    cpu, wall = [], []
    for _ in range(7):
        c, w = time.process_time(), time.perf_counter()
        r = generate(model, prompts, cfg)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    out[f"{rule}/{cache}/T{temp}"] = {
        "cpu_median": sorted(cpu)[3], "wall_median": sorted(wall)[3], "nfe": r.nfe.tolist(),
        "digest": hashlib.sha256(str(r.tokens.tolist()).encode()).hexdigest()[:12]}
print(json.dumps(out))
