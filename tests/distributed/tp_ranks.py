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
  bf16 N            the embedded model in bfloat16 under TP vs in one process, both against the
                    float32 run: greedy token and masked top-1 agreement over N prompts per task
  layerwise FAMILIES  the attention-reading caches (d2, elastic variants): greedy fp32 decodes of
                    the TP and the whole model, and the collectives of a full and a cheap step
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
            kv_split = whole.parts()[1][0].n_kv_heads % groups.tp == 0   # DTensor cannot replicate
            if runtime == "reference" and name in DTENSOR_FAMILIES and kv_split:
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


def block_of(model) -> int:
    """The decode block: the model's own block for block-diffusion families, else 8."""
    return min(getattr(model, "block_size", 8), 8)


def decode_all(model, schedulers, caches) -> dict:
    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate

    out = {}
    for s_name, s_cls in sorted(schedulers.items()):
        for c_name, c_cls in sorted(caches.items()):
            key = f"{s_name}/{c_name}"
            try:
                config = DecodeConfig(scheduler=s_cls(), cache=c_cls(), gen_length=16,
                                      block_length=block_of(model), temperature=0.0)
                result = generate(model, PROMPTS, config)
            except (ValueError, TypeError) as err:
                out[key] = f"refused: {type(err).__name__}: {err}"
                continue
            except RuntimeError as err:    # a loop invariant broken: recorded, must match too
                out[key] = f"failed: {err}"
                continue
            out[key] = [[int(t) for t in row] for row in result.tokens]
    return out


def host_syncs(model, config) -> dict:
    """Host conversions inside `Decoding.step` of a TP decode (dual cache), with the steps and
    block starts they are allowed per (`tests/test_host_syncs.py`'s counter)."""
    import pytest

    from dllm_decode.caches import CACHES
    from dllm_decode.sampler import generate
    from tests.test_host_syncs import SyncCounter

    patch = pytest.MonkeyPatch()
    try:
        counter = SyncCounter(patch)
        counting = counter.model(model)
        generate(counting, PROMPTS, dataclasses.replace(config, cache=CACHES["dual"]()))
    finally:
        patch.undo()
    return {"syncs": counter.syncs, "forwards": counter.forwards, "blocks": counter.blocks}


def task_decode(groups, names: list[str]) -> dict:
    """The whole model decodes on TP rank 0 only (the other ranks would compute the same)."""
    from dllm_decode.caches import CACHES
    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate
    from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS, ThresholdScheduler

    out = {}
    for name in names:
        whole = family(name)
        sharded = shard_model(copy.deepcopy(whole), groups)
        out[name] = {"whole": decode_all(whole, MASK_SCHEDULERS, CACHES) if groups.tp_rank == 0 else {},
                     "tp": decode_all(sharded, MASK_SCHEDULERS, CACHES)}
        # collectives of a whole decode (no cache: one forward per step)
        config = DecodeConfig(scheduler=ThresholdScheduler(), gen_length=16,
                              block_length=block_of(whole))
        with CollectiveCounter() as counter:
            result = generate(sharded, PROMPTS, config)
        out[name]["decode_counts"] = dict(counter.counts)
        out[name]["host_syncs"] = host_syncs(sharded, config)
        out[name]["steps"] = int(result.nfe.max())
        out[name]["layers"] = len(whole.parts()[1])
    return out


LAYERWISE = {"d2": ("d2", {}), "d2_refresh": ("d2", {"refresh_k": 1}),
             "elastic": ("elastic", {}), "elastic_heads": ("elastic", {"drift": "heads"}),
             "elastic_always": ("elastic", {"gamma": 2.0}), "elastic_never": ("elastic", {"gamma": 0.0}),
             "es": ("es", {}), "es_key": ("es", {"signal": "key"})}
"""The d2, Elastic-Cache and ES-dLLM variants run under TP: each statistic over heads takes another
path (ES-dLLM's hidden-state change needs none, its key change one all_reduce)."""


def layerwise_steps(model, cache) -> dict:
    """A full step then a cheap step (two tokens committed) of `cache`, called directly: the
    collectives of each, the logits' digest, the layers refreshed."""
    mask_id = model.mask_token_id
    canvas = torch.randint(0, 30, (2, 20), generator=torch.Generator().manual_seed(3))
    canvas[:, 4:] = mask_id
    steps, state = [], cache.init_state(model)
    with torch.inference_mode():
        for block_step in (0, 2):
            if block_step:
                canvas[:, 4:6] = torch.tensor([[21, 22], [23, 24]])
            with CollectiveCounter() as counter:
                logits, _, state = cache.logits(model, canvas, None, (4, 12), block_step, state)
            report = cache.report(state)
            steps.append({"counts": dict(counter.counts), "digest": digest(logits), "logits": logits,
                          "refreshed": int(report["refreshed_layers"].max())})
    return steps


def task_layerwise(groups, names: list[str]) -> dict:
    from dllm_decode.caches import CACHES
    from dllm_decode.config import DecodeConfig
    from dllm_decode.sampler import generate
    from dllm_decode.schedulers import SCHEDULERS

    out = {}
    for name in names:
        whole = family(name)
        sharded = shard_model(copy.deepcopy(whole), groups)
        record = {"layers": len(whole.parts()[1]), "decodes": {}, "steps": {}}
        for key, (cache_name, options) in LAYERWISE.items():
            for s_name in ("low_confidence", "threshold") if key in ("d2", "elastic") else ("low_confidence",):
                config = DecodeConfig(scheduler=SCHEDULERS[s_name](), cache=CACHES[cache_name](**options),
                                      gen_length=16, block_length=8, temperature=0.0)
                tokens = lambda m: [[int(t) for t in row] for row in generate(m, PROMPTS, config).tokens]  # noqa: E731
                record["decodes"][f"{s_name}/{key}"] = {"tp": tokens(sharded), "whole": tokens(whole)}
            got = layerwise_steps(sharded, CACHES[cache_name](**options))
            expected = layerwise_steps(whole, CACHES[cache_name](**options))
            for step, reference in zip(got, expected):
                step["ulps"] = ulps(step.pop("logits"), reference["logits"])
                step["whole_refreshed"] = reference["refreshed"]
            record["steps"][key] = got
        out[name] = record
    return out


def agreement(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """[agreeing, compared] positions."""
    return [int((a == b).sum()), a.numel()]


def task_bf16(groups, per_task: str) -> dict:
    """Greedy decodes (low_confidence, 16 tokens, blocks of 8) of `per_task` prompts of each
    Waiting Line task, by the float32 model, the bfloat16 model and the bfloat16 model under TP;
    and the top-1 token at a seeded half of the float32 answers' positions masked (one forward
    per prompt). Returns the agreement counts with float32 and the TP tokens' digest."""
    from dllm_decode.config import DecodeConfig
    from dllm_decode.eval.tasks import TASKS, WAITING_LINE
    from dllm_decode.models.loading import load_model
    from dllm_decode.sampler import generate
    from dllm_decode.schedulers import SCHEDULERS

    fp32 = load_model("embedded", dtype="float32")
    bf16 = load_model("embedded", dtype="bfloat16")
    sharded = shard_model(copy.deepcopy(bf16), groups)
    tokenize = lambda text: fp32.tokenizer(text, add_special_tokens=False)["input_ids"]   # noqa: E731
    prompts = [tokenize(example.prompt) for op in WAITING_LINE
               for example in TASKS[op].examples("test", int(per_task), seed=0)]
    config = DecodeConfig(scheduler=SCHEDULERS["low_confidence"](), gen_length=16, block_length=8,
                          temperature=0.0)
    decoded = {name: generate(model, prompts, config).tokens
               for name, model in (("fp32", fp32), ("bf16", bf16), ("tp", sharded))}
    generator = torch.Generator().manual_seed(4)
    top1 = {"bf16": [], "tp": [], "fp32": []}
    with torch.inference_mode():
        for prompt, answer in zip(prompts, decoded["fp32"]):
            ids = torch.tensor([prompt + answer.tolist()])
            hidden = torch.rand(answer.shape, generator=generator) < 0.5
            ids[0, len(prompt):][hidden] = fp32.mask_token_id
            for name, model in (("fp32", fp32), ("bf16", bf16), ("tp", sharded)):
                logits = model(ids, rows=(len(prompt), ids.shape[1]))[0]
                top1[name].append(logits.float().argmax(-1)[hidden])
    top1 = {name: torch.cat(values) for name, values in top1.items()}
    return {"prompts": len(prompts), "digest": digest(decoded["tp"]),
            "tokens": {name: agreement(decoded[name], decoded["fp32"]) for name in ("bf16", "tp")},
            "sequences": {name: agreement((decoded[name] == decoded["fp32"]).all(-1),
                                          torch.ones(len(prompts), dtype=torch.bool))
                          for name in ("bf16", "tp")},
            "top1": {name: agreement(top1[name], top1["fp32"]) for name in ("bf16", "tp")},
            "tp_dtype": str(next(sharded.parameters()).dtype)}


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
    groups = init_parallel(int(os.environ["WORLD_SIZE"]), timeout_s=300)   # a hang fails, not waits
    if task == "logits":
        result = task_logits(groups, args[0].split(","))
    elif task == "decode":
        result = task_decode(groups, args[0].split(","))
    elif task == "bf16":
        result = task_bf16(groups, args[0])
    elif task == "layerwise":
        result = task_layerwise(groups, args[0].split(","))
    else:
        result = task_load(groups, args[0])
    atomic_write(Path(out) / f"result.rank{groups.rank}.json", json.dumps(result), "rank result")
    shutdown_parallel()


if __name__ == "__main__":
    main()
