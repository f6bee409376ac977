"""Requests joining running batches in the engine: cost and token agreement of per-row windows
(prefix, dual) and of held joins (caches with batch-wide state), side by side in one process.

Arms, alternated round by round:
  * prefix / dual: "shared" = the step's window shared by every row (the old behaviour: own
    windows switched off by making `RowWindows.keep` return None), "own" = each row keeps its
    K/V outside its own window (this branch);
  * elastic / dllm_cache / es / d2 / suffix: "join" = newcomers join the running batch mid-run
    (`mid_run_joins` patched to True: the old admission), "held" = they start another running
    batch (this branch).
Per arm: wall seconds of the whole engine run, engine rounds, model forwards, fed rows x columns, most running batches at once, answers that differ from `generate` alone.

    OMP_NUM_THREADS=1 nice -n 10 python measurements/cpu_2026-11-29_joininvar/run.py --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time

import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.engine import Engine, Request
from dllm_decode.registry import component
from dllm_decode.row_windows import RowWindows
from dllm_decode.sampler import generate
from dllm_decode.modelspec import ModelSpec, load_diffusion


def prompts(model, n: int) -> list[list[int]]:
    from dllm_decode.eval.tasks import TASKS

    names = ["sort", "copy", "reverse", "shuffle"]
    examples = [e for i, name in enumerate(names) for e in TASKS[name].examples("test", n // len(names), i)]
    return [model.tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]


@contextlib.contextmanager
def arm(name: str, cache):
    """The old behaviour for the "shared" and "join" arms; this branch's otherwise."""
    saved_keep, kind = RowWindows.keep, type(cache)
    saved_joins = kind.__dict__.get("mid_run_joins")
    if name == "shared":
        RowWindows.keep = lambda self, own, length, device, lookback=0: None
    if name == "join":
        kind.mid_run_joins = True
    try:
        yield
    finally:
        RowWindows.keep = saved_keep
        if name == "join":
            if saved_joins is None:
                del kind.mid_run_joins
            else:
                kind.mid_run_joins = saved_joins


class Counter:
    """Counts the model's forwards and their fed rows x columns: one embedding call per forward
    (the model's own forward and the layer-by-layer caches' alike)."""

    def __init__(self, model):
        self.calls = self.cells = 0
        self.handle = model.parts()[0].register_forward_hook(self)

    def __call__(self, module, inputs, output):
        self.calls += 1
        self.cells += inputs[0].numel()


def run(model, config: DecodeConfig, ids: list[list[int]], max_batch: int, alone: list[list[int]]) -> dict:
    counter = Counter(model)
    engine = Engine(model, max_batch_size=max_batch)
    try:
        start = time.perf_counter()
        for i, p in enumerate(ids):
            engine.add(Request(str(i), p, dataclasses.replace(config, seed=i)))
        outputs, rounds, batches = {}, 0, 0
        while engine.has_work:
            for u in engine.step():
                if u.finished:
                    outputs[u.request_id] = list(u.output.tokens)
            rounds += 1
            batches = max(batches, engine.backend.batches)
        seconds = time.perf_counter() - start
    finally:
        counter.handle.remove()
    differ = sum(outputs[str(i)] != alone[i] for i in range(len(ids)))
    return {"seconds": seconds, "rounds": rounds, "forwards": counter.calls, "fed_cells": counter.cells,
            "most_batches": batches, "differ_from_alone": differ}


def scheduler(text: str) -> dict:
    """"threshold:threshold=0.9" -> {"name": "threshold", "threshold": 0.9}."""
    name, _, rest = text.partition(":")
    return {"name": name, **{k: float(v) for k, v in (kv.split("=") for kv in rest.split(",") if kv)}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--caches", default="prefix,dual,elastic,dllm_cache,es,d2,suffix")
    parser.add_argument("--scheduler", default="threshold:threshold=0.9")
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--block-length", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = load_diffusion(ModelSpec.parse("embedded"))
    ids = prompts(model, args.requests)
    results = {}
    for name in args.caches.split(","):
        cache = component("cache", name)
        config = DecodeConfig(scheduler=component("scheduler", scheduler(args.scheduler)), cache=cache,
                              gen_length=args.gen_length, block_length=args.block_length)
        alone = []
        for p in ids:
            r = generate(model, [p], config)
            alone.append(r.tokens[0, :int(r.answer_lengths[0])].tolist())
        arms = ("shared", "own") if cache.mid_run_joins else ("join", "held")
        rows = {a: [] for a in arms}
        for k in range(args.rounds):
            for a in (arms if k % 2 == 0 else arms[::-1]):
                with arm(a, cache):
                    rows[a].append(run(model, config, ids, args.max_batch, alone))
                print(name, a, rows[a][-1], flush=True)
        results[name] = rows
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
