"""What each rank runs for the tensor-parallel tests (`python -m tests.distributed.tp_ranks OUT
TASK ...` under torchrun). Every rank builds the whole model too (the single-process reference,
seeded identically), shards a copy, and records comparisons and digests of its outputs in
`OUT/result.rank<r>.json`.

Tasks:
  logits FAMILIES   TP logits vs the whole model (both runtimes), digests, collective counts
  decode FAMILIES   greedy fp32 decodes over the whole scheduler registry x every cache the
                    family accepts: tokens of the TP model and of the whole model
  load DIR          load_model(DIR, tensor_parallel=world) from disk: anonymous-memory growth,
                    resident weight bytes, logits vs the whole model
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from dllm_decode.models.compact import set_runtime
from dllm_decode.outputs import atomic_write
from dllm_decode.parallel import CollectiveCounter, init_parallel, shard_model, shutdown_parallel
from dllm_decode.parallel.dtensor_plan import parallelize_with_dtensor

DTENSOR_FAMILIES = ("llada", "dream", "fast_dllm", "sdar", "embedded")
"""Checked against DTensor's `parallelize_module` too (untied heads, KV heads divisible)."""

PROMPTS = [[10, 11, 12, 13], [14, 15, 16, 17, 18, 19], [20]]


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.3 if p.dim() > 1 else 1 + 0.2 * noise)
    return model.eval()


def family(name: str) -> torch.nn.Module:
    """A tiny seeded model of `name` (4 heads, 2 KV heads where the layout has GQA, odd vocab)."""
    from dllm_decode.models.dream import DreamConfig, DreamModel
    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM
    from dllm_decode.models.loading import load_model
    from dllm_decode.testing import tiny_block_diffusion

    ids = dict(vocab_size=37, mask_token_id=36, eos_token_id=35, pad_token_id=35)
    if name.startswith("embedded"):
        return load_model(name, dtype="float32")
    if name in ("llada", "llada_tied"):
        config = LLaDAConfig(d_model=32, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=48,
                             weight_tying=name == "llada_tied", **ids)
        return randomized(LLaDAModelLM(config), 0)
    if name in ("dream", "dream_tied"):
        config = DreamConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=48,
                             tie_word_embeddings=name == "dream_tied", **ids)
        return randomized(DreamModel(config), 0)
    return tiny_block_diffusion(name)            # fast_dllm, sdar


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float32 ulps of b's scale (`dllm_decode.testing.logits_tolerance`)."""
    scale = max(float(b.abs().amax()), 1.0)
    return float((a - b).abs().amax()) / (torch.finfo(torch.float32).eps * scale)


def task_logits(groups, names: list[str]) -> dict:
    out = {}
    ids = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(1))
    for name in names:
        for runtime in ("reference", "compact"):
            whole = set_runtime(family(name), runtime)
            sharded = set_runtime(shard_model(copy.deepcopy(whole), groups), runtime)
            with torch.inference_mode():
                expected = whole(ids, rows=(4, 12))
                with CollectiveCounter() as counter:
                    got = sharded(ids, rows=(4, 12))
            if runtime == "reference" and name in DTENSOR_FAMILIES:
                dtensor_model = parallelize_with_dtensor(copy.deepcopy(whole), groups)
                with torch.inference_mode(), CollectiveCounter() as dtensor_counter:
                    via_dtensor = dtensor_model(ids, rows=(4, 12))
                out[f"{name}/dtensor"] = {"ulps": ulps(via_dtensor, expected),
                                          "ulps_explicit": ulps(via_dtensor, got),
                                          "counts": dict(dtensor_counter.counts)}
            out[f"{name}/{runtime}"] = {
                "ulps": ulps(got, expected), "digest": digest(got), "shape": list(got.shape),
                "layers": len(whole.parts()[1]), "counts": dict(counter.counts),
                "bytes": dict(counter.bytes), "heads": sharded.parts()[1][0].n_heads}
    return out


def decode_all(model, schedulers, caches) -> dict:
    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate

    out = {}
    for s_name, s_cls in sorted(schedulers.items()):
        for c_name, c_cls in sorted(caches.items()):
            key = f"{s_name}/{c_name}"
            try:
                config = DecodeConfig(scheduler=s_cls(), cache=c_cls(), gen_length=16,
                                      block_length=8, temperature=0.0)
                result = generate(model, PROMPTS, config)
            except (ValueError, TypeError) as err:
                out[key] = f"refused: {type(err).__name__}: {err}"
                continue
            out[key] = [[int(t) for t in row] for row in result.tokens]
    return out


def task_decode(groups, names: list[str]) -> dict:
    """The whole model decodes on TP rank 0 only (the other ranks would compute the same)."""
    from dllm_decode.caches import CACHES
    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate
    from dllm_decode.schedulers import SCHEDULERS, ThresholdScheduler

    out = {}
    for name in names:
        whole = family(name)
        sharded = shard_model(copy.deepcopy(whole), groups)
        out[name] = {"whole": decode_all(whole, SCHEDULERS, CACHES) if groups.tp_rank == 0 else {},
                     "tp": decode_all(sharded, SCHEDULERS, CACHES)}
        # collectives of a whole decode (no cache: one forward per step)
        config = DecodeConfig(scheduler=ThresholdScheduler(), gen_length=16, block_length=8)
        with CollectiveCounter() as counter:
            result = generate(sharded, PROMPTS, config)
        out[name]["decode_counts"] = dict(counter.counts)
        out[name]["steps"] = int(result.nfe.max())
        out[name]["layers"] = len(whole.parts()[1])
    return out


def anonymous_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def task_load(groups, directory: str) -> dict:
    import gc

    from dllm_decode.models.loading import load_model
    from dllm_decode.parallel.loading import resident_weight_bytes

    import safetensors.torch  # noqa: F401 - imported before measuring

    gc.collect()
    before = anonymous_bytes()
    sharded = load_model(directory, tensor_parallel=groups.tp, runtime="compact")
    grown = anonymous_bytes() - before
    resident = resident_weight_bytes(sharded)
    dtype = str(next(sharded.parameters()).dtype)
    ids = torch.randint(0, 100, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got = sharded(ids, rows=(2, 10))
    del sharded
    gc.collect()
    whole = load_model(directory, runtime="compact", dtype=dtype.removeprefix("torch."))
    with torch.inference_mode():
        expected = whole(ids, rows=(2, 10))
    native = load_model("embedded", tensor_parallel=groups.tp)       # a bfloat16 checkpoint
    return {"embedded_dtype": str(next(native.parameters()).dtype), "anon_growth": grown, "resident": resident, "whole_resident": resident_weight_bytes(whole),
            "dtype": dtype, "ulps": ulps(got.float(), expected.float()), "digest": digest(got)}


def main() -> None:
    out, task, *args = sys.argv[1:]
    torch.use_deterministic_algorithms(True, warn_only=True)
    groups = init_parallel(int(os.environ["WORLD_SIZE"]))
    if task == "logits":
        result = task_logits(groups, args[0].split(","))
    elif task == "decode":
        result = task_decode(groups, args[0].split(","))
    else:
        result = task_load(groups, args[0])
    atomic_write(Path(out) / f"result.rank{groups.rank}.json", json.dumps(result), "rank result")
    shutdown_parallel()


if __name__ == "__main__":
    main()
