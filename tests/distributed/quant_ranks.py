"""What each rank runs for the quantized tensor-parallel test (`python -m
tests.distributed.quant_ranks OUT FAMILIES` under torchrun): every rank quantizes the whole model
(the one-process reference) and its own shard of a copy, both with the same format, and records
the logits' difference and digest per (family, format) in `OUT/result.rank<r>.json`."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch

from dllm_decode.outputs import atomic_write
from dllm_decode.parallel import init_parallel, shard_model, shutdown_parallel
from dllm_decode.models.layers import KVCache
from dllm_decode.quant import QuantLinear, quantize_model
from dllm_decode.quant.kv import set_kv_cache_dtype
from tests.distributed.tp_ranks import digest, family, ulps

# int4 groups must lie inside a row-parallel shard: the tiny models' o / down shards are 16 / 24
# columns wide at TP 2, the embedded models' 96 / 256
GROUPS = {"embedded": 32}


def cached_step(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    kv = KVCache.for_model(model)
    with torch.inference_mode():
        model(ids, kv=kv, rows=(4, 12))
        return model(ids, kv=kv, rows=(4, 8))


def main() -> None:
    out, names = sys.argv[1], sys.argv[2].split(",")
    torch.use_deterministic_algorithms(True, warn_only=True)
    groups = init_parallel(int(os.environ["WORLD_SIZE"]), timeout_s=300)
    ids = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(1))
    result = {}
    for name in names:
        for fmt in ("int8", "fp8", f"int4:{GROUPS.get(name.split('-')[0], 8)}"):
            whole = family(name)
            single = quantize_model(copy.deepcopy(whole), fmt)
            sharded = quantize_model(shard_model(copy.deepcopy(whole), groups), fmt)
            with torch.inference_mode():
                expected, got = single(ids, rows=(4, 12)), sharded(ids, rows=(4, 12))
            layers = sum(isinstance(m, QuantLinear) for m in sharded.modules())
            result[f"{name}/{fmt}"] = {"ulps": ulps(got, expected), "digest": digest(got),
                                       "quantized_layers": layers}
            if fmt == "int8":               # and an fp8 KV cache: a refresh, then a cached step
                expected, got = (cached_step(set_kv_cache_dtype(m, "fp8"), ids) for m in (single, sharded))
                result[f"{name}/{fmt}/kv-fp8"] = {
                    "ulps": ulps(got, expected), "digest": digest(got), "quantized_layers": layers,
                    "relative": ((got - expected).abs().max() / expected.abs().max()).item()}
    atomic_write(Path(out) / f"result.rank{groups.rank}.json", json.dumps(result), "rank result")
    shutdown_parallel()


if __name__ == "__main__":
    main()
