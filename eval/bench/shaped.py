"""`dllm-decode bench shaped`: a LLaDA-8B-shaped model with random weights on any device.

The GPU serving path: tokens/s, loop overhead and cache speed-ups at batch 1, 8, 32
and 64 on a model of LLaDA-8B's shape (32 layers, width 4096, 32 heads, MLP 12288, vocabulary
126,464), random bf16 weights built on the device (no download, no checkpoint). Random weights
make the threshold rule commit one token per step, so the benchmark decodes a fixed number of
tokens per step (`low_confidence` with `steps_per_block`) and every configuration does the same
number of forwards; tokens/s counts canvas tokens (a random model's answers mean nothing).
`--layers` shrinks the depth (a CPU smoke run, or a GPU that cannot hold 16 GB of weights).
`--runtime compact` times the compact runtime (`models/compact.py`) beside the reference blocks,
on the same weights (the fused copies take as much memory again), each row with its ratio.

Loop overhead is the share of wall-clock outside the model's forward; on CUDA the forward timer
synchronises around every forward, so that share is real GPU idle time, not launch latency.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dllm_decode.eval.bench.timing import check_counts, interleave

SHAPES: dict[str, dict[str, Any]] = {
    "llada-8b": {},                                   # LLaDAConfig's defaults are LLaDA-8B's
    "embedded": dict(d_model=192, n_heads=6, n_layers=4, mlp_hidden_size=512, vocab_size=129,
                     max_sequence_length=1024, mask_token_id=3, eos_token_id=2, pad_token_id=0),
}
CACHES = ("none", "prefix", "dual")
RUNTIMES = ("reference", "compact")


@dataclass(frozen=True)
class ShapedOptions:
    """What `bench shaped` runs (every count >= 1; `layers` None keeps the shape's depth)."""

    shape: str = "llada-8b"
    layers: int | None = None
    device: str = "cpu"
    dtype: str = "bfloat16"
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    prompt_length: int = 64
    gen_length: int = 256
    block_length: int = 32
    steps_per_block: int = 2
    repeats: int = 2
    caches: tuple[str, ...] = CACHES
    runtimes: tuple[str, ...] = ("reference",)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; choose from {sorted(SHAPES)}")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        check_counts(self, "prompt_length", "gen_length", "block_length", "steps_per_block", "repeats")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if self.gen_length % self.block_length:
            raise ValueError(f"gen_length ({self.gen_length}) must be a multiple of block_length "
                             f"({self.block_length})")
        unknown = set(self.caches) - set(CACHES)
        if unknown or not self.caches:
            raise ValueError(f"caches must be some of {list(CACHES)}, got {list(self.caches)}")
        if set(self.runtimes) - set(RUNTIMES) or not self.runtimes:
            raise ValueError(f"runtimes must be some of {list(RUNTIMES)}, got {list(self.runtimes)}")


def shaped_model(options: ShapedOptions) -> Any:
    """A LLaDA of the option's shape, seeded random weights, built directly on the device."""
    from dllm_decode.models.llada import LLaDAConfig, LLaDAModelLM

    sizes = dict(SHAPES[options.shape])
    if options.layers is not None:
        sizes["n_layers"] = options.layers
    device, dtype = torch.device(options.device), getattr(torch, options.dtype)
    torch.manual_seed(options.seed)
    with torch.device(device):
        model = LLaDAModelLM(LLaDAConfig(**sizes)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
            else:
                p.fill_(1.0)
    return model.eval()


def prompts_for(model: Any, options: ShapedOptions, count: int) -> list[list[int]]:
    """`count` random prompts of `prompt_length` ordinary tokens (never [MASK] or EOS)."""
    generator = torch.Generator().manual_seed(options.seed)
    special = {model.mask_token_id, *model.eos_token_ids}
    ids = torch.randint(0, model.vocab_size, (count, options.prompt_length), generator=generator)
    ids = ids.masked_fill(torch.isin(ids, torch.tensor(sorted(special))), 5)
    return ids.tolist()


def run_shaped(options: ShapedOptions, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Decode `max(batch_sizes)` prompts in batches of each size under each cache, interleaved;
    returns the JSON-ready report (rows per cache and batch size)."""
    from dllm_decode import DecodeConfig
    from dllm_decode.caches import CACHES as REGISTRY
    from dllm_decode.eval.bench.measure import Combo, Measured, decode_once
    from dllm_decode.schedulers import LowConfidenceScheduler

    from dllm_decode.devices import device_name, device_sync
    from dllm_decode.eval.bench.forward import runtime_view

    model = shaped_model(options)
    views = {runtime: runtime_view(model, runtime) for runtime in options.runtimes}
    sync = device_sync(torch.device(options.device))
    prompts = prompts_for(model, options, max(options.batch_sizes))
    configs = {cache: DecodeConfig(scheduler=LowConfidenceScheduler(steps_per_block=options.steps_per_block),
                                   cache=REGISTRY[cache](), gen_length=options.gen_length,
                                   block_length=options.block_length, stop_at_eos=False)
               for cache in options.caches}
    plans = [(f"{cache}@B{b}@{runtime}", [prompts[i:i + b] for i in range(0, len(prompts), b)])
             for runtime in options.runtimes for cache in options.caches for b in options.batch_sizes]
    for runtime, view in views.items():                                              # warm-up
        decode_once(view, prompts[:1], configs[options.caches[0]], sync=sync)
    parameters = sum(p.numel() for p in model.parameters())
    say(f"{options.shape} on {options.device}: {len(plans)} configurations x {options.repeats} repeats")

    def job(label: str, index: int, chunk: list[list[int]]) -> Callable[[], Any]:
        cache, _, runtime = label.split("@")
        return lambda: decode_once(views[runtime], chunk, configs[cache], sync=sync)

    runs = interleave(plans, options.repeats, job)

    def seconds(cache: str, b: int, runtime: str) -> float:
        return runs[f"{cache}@B{b}@{runtime}"].seconds()

    rows = []
    for runtime in options.runtimes:
        for cache in options.caches:
            for b in options.batch_sizes:
                measured = Measured(Combo(cache, configs[cache]), runs[f"{cache}@B{b}@{runtime}"])
                spent = measured.seconds()
                rows.append({"runtime": runtime, "cache": cache, "batch": b, "seconds": spent,
                             "tokens_per_second": options.gen_length * len(prompts) / spent,
                             "overhead": measured.overhead(), "nfe": statistics.fmean(measured.nfe()),
                             "vs_none": (seconds("none", b, runtime) / spent
                                         if "none" in options.caches else None),
                             "vs_reference": (seconds(cache, b, "reference") / spent
                                              if "reference" in options.runtimes else None)})
    return {"options": {**options.__dict__, "batch_sizes": list(options.batch_sizes),
                        "caches": list(options.caches), "runtimes": list(options.runtimes)},
            "device_name": device_name(torch.device(options.device)),
            "parameters": parameters, "prompts": len(prompts), "rows": rows}


def format_shaped(report: dict[str, Any]) -> str:
    """The report as a table: one line per cache and batch size."""
    o = report["options"]
    depth = f", {o['layers']} layers" if o["layers"] else ""
    lines = [f"{o['shape']}{depth}, {report['parameters'] / 1e6:,.1f} M parameters, {o['dtype']} on "
             f"{report['device_name']}; "
             f"{report['prompts']} prompts of {o['prompt_length']} tokens, gen {o['gen_length']}, "
             f"block {o['block_length']}, {o['steps_per_block']} steps per block",
             f"{'runtime':<11}{'cache':<8}{'batch':>6}{'tokens/s':>12}{'overhead':>10}{'NFE':>7}"
             f"{'vs none':>9}{'vs reference':>14}"]

    def ratio(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    for row in report["rows"]:
        lines.append(f"{row['runtime']:<11}{row['cache']:<8}{row['batch']:>6}"
                     f"{row['tokens_per_second']:>12.1f}{row['overhead']:>9.1%}{row['nfe']:>7.1f}"
                     f"{ratio(row['vs_none']):>9}{ratio(row['vs_reference']):>14}")
    return "\n".join(lines)
