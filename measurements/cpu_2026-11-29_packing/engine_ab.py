"""The compact runtime's packing (token-wise work on a left-padded batch's real columns only), on
and off side by side in one process: the `bench serving` task workload (the embedded model, 320
task prompts, greedy threshold 0.9, canvas 32 in blocks of 8) decoded offline one request at a
time, and by an `Engine` of 32 rows with every request queued at once, packing on and off,
interleaved over ROUNDS rounds. Prints per round the seconds of each arm and the ratios.

    cd /tmp && OMP_NUM_THREADS=1 python /path/to/measurements/cpu_2026-11-29_packing/engine_ab.py > out.txt
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine
from dllm_decode.eval.bench.subject import load_subject, task_samples
from dllm_decode.models import compact
from dllm_decode.registry import component
from dllm_decode.sampler import generate
from dllm_decode.serving import Request

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
torch.set_num_threads(1)
bench = load_subject("embedded", canvases=("mask",))
model, tokenizer = bench.model, bench.tokenizer
prompts = [s.prompt for s in task_samples(bench.tasks, 27, seed=0)][:320]
ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
config = DecodeConfig(scheduler=component("scheduler", {"name": "threshold", "threshold": 0.9}),
                      gen_length=32, block_length=8)
packing_of = compact.Packing.of


def offline() -> list[str]:
    return [generate(model, [i], config).text[0] for i in ids]


def engine(packing: bool) -> list[str]:
    compact.Packing.of = packing_of if packing else classmethod(lambda cls, present: None)
    try:
        e = Engine(model, tokenizer, max_batch_size=32)
        for k, i in enumerate(ids):
            e.add(Request(id=str(k), prompt=tuple(i), config=config, follow=False))
        out: dict[str, str] = {}
        while e.has_work:
            for u in e.step():
                if u.output is not None:
                    out[u.request_id] = u.output.text
        return [out[str(k)] for k in range(len(ids))]
    finally:
        compact.Packing.of = packing_of


def timed(fn, *args):
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


reference = offline()
engine(True), engine(False)                     # warm-up
rounds = []
for r in range(ROUNDS):
    t_off, _ = timed(offline)
    t_on, on = timed(engine, True)
    t_no, no = timed(engine, False)
    row = {"offline_s": round(t_off, 3), "engine_packed_s": round(t_on, 3), "engine_padded_s": round(t_no, 3),
           "packed_over_offline_speedup": round(t_off / t_on, 3), "padded_over_offline_speedup": round(t_off / t_no, 3),
           "packed_vs_padded_speedup": round(t_no / t_on, 3),
           "differing_answers_packed": sum(a != b for a, b in zip(on, reference)),
           "differing_answers_padded": sum(a != b for a, b in zip(no, reference))}
    rounds.append(row)
    print(json.dumps(row), flush=True)
keys = ("packed_over_offline_speedup", "padded_over_offline_speedup", "packed_vs_padded_speedup")
print(json.dumps({k: {"median": statistics.median(r[k] for r in rounds), "min": min(r[k] for r in rounds),
                      "max": max(r[k] for r in rounds)} for k in keys}))
