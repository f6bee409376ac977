"""What each rank runs for the tensor-parallel x capture test (`python -m
tests.distributed.capture_ranks OUT FAMILIES MODES` under torchrun): every rank decodes with the
whole model eagerly (the one-process reference, seeded identically) and with its shard under each
capture mode, and writes both token lists to `OUT/result.rank<r>.json`.

The configurations cover both routes of a captured decode: a rule that runs the whole step in
one graph (`threshold`), one whose decision stays on the host (`low_confidence`), and a sampled
decode (the noise drawn on the host from each request's generator); each with the caches the
family captures (none and dual; the block cache for block-diffusion families).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from pathlib import Path

import torch

from dllm_decode.outputs import atomic_write
from dllm_decode.parallel import CollectiveCounter, init_parallel, shard_model, shutdown_parallel
from tests.distributed.tp_ranks import PROMPTS, block_of, family


def configs(model) -> dict:
    from dllm_decode.caches import CACHES
    from dllm_decode.config import DecodeConfig
    from dllm_decode.schedulers import SCHEDULERS

    caches = ("block",) if getattr(model, "block_size", None) else ("none", "dual")
    out = {}
    for cache in caches:
        for rule, temperature in (("threshold", 0.0), ("low_confidence", 0.0), ("threshold", 0.8)):
            out[f"{rule}/{cache}/T{temperature}"] = DecodeConfig(
                scheduler=SCHEDULERS[rule](), cache=CACHES[cache](), gen_length=16,
                block_length=block_of(model), temperature=temperature, seed=3)
    return out


def run(groups, names: list[str], modes: list[str]) -> dict:
    from dllm_decode.capture import GraphCache, capture_problem
    from dllm_decode.sampler import generate

    out = {}
    for name in names:
        whole = family(name)
        sharded = shard_model(copy.deepcopy(whole), groups)
        for key, config in configs(whole).items():
            expected = generate(whole, PROMPTS, config)
            record = {"whole": expected.tokens.tolist(), "problem": capture_problem(config, sharded)}
            for mode in modes:
                graphs = GraphCache("compile", backend=mode.split(":")[1]) if mode.startswith(
                    "compile") else GraphCache(mode)
                # the counter is a dispatch mode, which torch.compile refuses: static mode only
                counter = CollectiveCounter() if mode == "static" else contextlib.nullcontext()
                with counter:
                    got = generate(sharded, PROMPTS, config, capture=graphs)
                record[mode] = {"tokens": got.tokens.tolist(), "nfe": got.nfe.tolist(),
                                "captures": graphs.captures}
                if mode == "static":
                    record[mode]["gathers"] = counter.counts.get("all_gather_into_tensor", 0)
            record["nfe"] = expected.nfe.tolist()
            out[f"{name}/{key}"] = record
    return out


def main() -> None:
    out, names, modes = sys.argv[1:]
    torch.use_deterministic_algorithms(True, warn_only=True)
    groups = init_parallel(int(os.environ["WORLD_SIZE"]), timeout_s=300)   # a hang fails, not waits
    result = run(groups, names.split(","), modes.split(","))
    atomic_write(Path(out) / f"result.rank{groups.rank}.json", json.dumps(result), "rank result")
    shutdown_parallel()


if __name__ == "__main__":
    main()
