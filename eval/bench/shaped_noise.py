"""`bench shaped --shape diffusion-gemma-26b-a4b`: a DiffusionGemma-shaped model (uniform-noise
canvases) with random weights on any device, timed against its roofline.

The model is built on the device from `shaped.NOISE_SHAPES` (no download, no checkpoint), seeded
random weights as `shaped_model` draws them. It decodes with the family's own rule
(`uniform_noise`) at a fixed `steps_per_block` decoder steps per canvas of `block_length` tokens
(`--block-length 256 --steps-per-block 48` is the released checkpoint's canvas and the rule's
default step budget); random weights never pass the stable-and-confident stopping test (its
entropy bound is set out of reach), so every configuration runs the same forwards: per canvas one
encoder pass over its fresh tokens and `steps_per_block` decoder passes. Experts run the default
`loop` form. Each row's floor comes from `noise_roofline` (the experts a batch's tokens choose,
the tied embedding read twice per self-conditioned step), and the report adds one
self-conditioned decoder step's bytes and read/compute floors per batch size (`step_floors`).

Only the eager step has a row: the captured decoder forward (`dllm_decode.capture.denoise`) is
not yet one the loop chooses, so a `captured` row says so; the compact runtime and the masked
caches do not apply to this family (their rows say so too).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dllm_decode.eval.bench.outcome import ours
from dllm_decode.eval.bench.protocol import OptionError
from dllm_decode.eval.bench.shaped import ShapedOptions, _compare, check_memory, shaped_model, timed_row
from dllm_decode.eval.bench.timing import interleave

CACHE = "-"
"""The cache column of a noise row: the encoder cache is the family's own, not a choice."""


def noise_prompts(model: Any, options: ShapedOptions, count: int) -> list[list[int]]:
    """`count` random prompts of `prompt_length` tokens, never an end-of-text id."""
    generator = torch.Generator().manual_seed(options.seed)
    ids = torch.randint(3, model.vocab_size, (count, options.prompt_length), generator=generator)
    eos = torch.tensor([e for e in model.eos_token_ids if e is not None] or [-1])
    return ids.masked_fill(torch.isin(ids, eos), 5).tolist()


def _unavailable(options: ShapedOptions) -> list[dict[str, Any]]:
    """Rows for what this family does not run, with why."""
    rows = []
    for runtime in options.runtimes:
        for variant in options.variants:
            note = None
            if runtime != "reference":
                note = "not available: the compact runtime fuses the masked families' blocks"
            elif variant == "captured":
                note = ("not available: the noise loop calls the decoder eagerly (the captured forward, "
                        "dllm_decode.capture.denoise, is not yet one the loop chooses)")
            if note:
                rows += [{"runtime": runtime, "variant": variant, "cache": CACHE, "batch": b, "model": "noise",
                          "available": False, "note": note} for b in options.batch_sizes]
    return rows


def run_noise_shaped(options: ShapedOptions, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Decode `prompt_count` prompts in batches of each size, interleaved repeats; returns the
    report `shaped.format_shaped` prints (one row per batch size, each with its floors)."""
    from dllm_decode import DecodeConfig
    from dllm_decode.devices import device_name, device_peaks
    from dllm_decode.eval.bench.noise_roofline import NoiseShape, plan, step_floors
    from dllm_decode.eval.bench.roofline import UNKNOWN_DEVICE, floor
    from dllm_decode.schedulers import UniformNoiseScheduler

    if options.gen_length % options.block_length:
        raise OptionError("--gen-length", f"gen_length ({options.gen_length}) must be whole canvases of "
                                          f"{options.block_length}")
    check_memory(options, {"noise"})
    model = shaped_model(options, "noise")
    prompts = noise_prompts(model, options, options.prompt_count)
    rule = UniformNoiseScheduler(steps=options.steps_per_block, confidence_threshold=1e-30)
    config = DecodeConfig(rule, gen_length=options.gen_length, block_length=options.block_length,
                          stop_at_eos=False, seed=options.seed)
    runs_eager = "reference" in options.runtimes and "eager" in options.variants
    rows = _unavailable(options)
    name = device_name(torch.device(options.device))
    peaks = device_peaks(name)
    shape = NoiseShape.of(model)
    forwards = plan(options.prompt_length, options.gen_length, options.block_length, options.steps_per_block)
    say(f"{options.shape} on {name}: {len(options.batch_sizes)} batch sizes x {options.repeats} repeats")
    if not runs_eager:
        raise OptionError("--step", "nothing to run: this family runs the reference runtime's eager step")
    ours(model, prompts[:1], config, None)                      # warm-up
    plans = [(f"B{b}", [prompts[i:i + b] for i in range(0, options.prompt_count, b)]) for b in options.batch_sizes]
    runs = interleave(plans, options.repeats, lambda label, index, chunk: (lambda: ours(model, chunk, config, None)))
    for b in options.batch_sizes:
        measured = runs[f"B{b}"]
        bound = floor(shape, forwards, b, peaks, options.dtype)
        rows.append({"runtime": "reference", "variant": "eager", "cache": CACHE, "batch": b, "model": "noise",
                     **timed_row(options, measured.seconds(), measured.values(), bound)})
    _compare(rows)
    last = options.prompt_length + options.gen_length - options.block_length
    return {"options": {**options.__dict__, "batch_sizes": list(options.batch_sizes), "caches": [CACHE],
                        "runtimes": list(options.runtimes), "variants": list(options.variants),
                        "peers": [list(p) for p in options.peers]},
            "device_name": name, "peaks": peaks.__dict__ if peaks else UNKNOWN_DEVICE,
            "parameters": {"noise": sum(p.numel() for p in model.parameters())},
            "prompts": options.prompt_count, "rows": rows, "graph_pools": {},
            "forwards_per_decode": len(forwards),
            "step_floors": {str(b): step_floors(shape, last, options.block_length, b, peaks, options.dtype)
                            for b in options.batch_sizes}}
