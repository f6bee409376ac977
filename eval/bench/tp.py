"""`dllm-decode bench tp`: tensor-parallel scaling, on paper and measured.

**The paper model.** One decode step is one forward of B canvases feeding `rows` rows each
(N = B x rows tokens) that returns logits for a `window` of rows. Over a TP group of t ranks each
rank does 1/t of the FLOPs and reads 1/t of the sharded weights, then waits for the collectives
the plan issues (`dllm_decode.parallel`; counted exactly by `CollectiveCounter`):

* 2 all_reduces per layer (attention output, MLP output) and 1 for the vocabulary-parallel
  embedding, each of N x d values in the model dtype (the MoE layer's in float32);
* 1 all_gather of the window's logits, each rank contributing B x window x ceil(V / t) values.

A rank's step takes max(FLOPs / peak, bytes / bandwidth) (its roofline: no faster is possible)
plus the collectives, which sit on the critical path (nothing overlaps them in a TP forward):
a ring all_reduce costs alpha + 2 (t - 1) / t x payload / link, an all_gather
alpha + (t - 1) x payload / link, with `link` the per-direction bandwidth of one GPU's link.
One GPU's step is its roofline alone. The predicted speed-up is their ratio: tokens per step
do not change with t, so it is also the tokens/s ratio. What the model leaves out, and so what
a measurement adds: per-op dispatch (an eager batch-1 forward on an H100 takes ~16 ms against a
~4.6 ms roofline, and dispatch does not shrink with t: TP pays only with a captured step),
kernel efficiency below the datasheet peaks, and NCCL's real latency.

Constants (`LINKS`, `PEAKS`): H100 SXM HBM3 3.35 TB/s and 989.4 dense BF16 TFLOPS (datasheet);
NVLink 4 900 GB/s per GPU counted both ways, so 450 GB/s per direction; PCIe gen5 x16 64 GB/s per
direction; alpha 10 us (NVLink) and 20 us (PCIe) per collective: assumed, not measured here.
The LLaDA2-flash shape is a reading of the Ling-flash-2.0 configuration it is built on, not of
its own `config.json` (not available here); its totals come out at ~103 B parameters and ~6 B
active, as its model card states.

**The measurement** (`run_tp`): under `torchrun --nproc_per_node N -m dllm_decode bench tp`,
every rank builds the same seeded random model of the shape; TP rank 0 times the whole model
alone (the one-GPU baseline) while the others wait, then every rank times the sharded model,
interleaved over repeats; one sharded forward runs under `CollectiveCounter`, and its counts and
payload bytes are reported beside the paper model's for the same shape, so the model's counting
is checked wherever the benchmark runs (CPU and gloo included). Without a launcher (one process)
it reports the paper model only.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float          # bytes/s per direction, per GPU
    latency: float            # seconds per collective


@dataclass(frozen=True)
class Peaks:
    name: str
    memory: float             # bytes/s
    flops: float              # dense bf16 FLOP/s


LINKS = {"nvlink": Link("NVLink 4 (H100)", 450e9, 10e-6),
         "pcie": Link("PCIe gen5 x16", 64e9, 20e-6)}
PEAKS = Peaks("H100 SXM", 3.35e12, 989.4e12)


@dataclass(frozen=True)
class Shape:
    """A model's sizes as the TP plan splits them (dense when `experts` is 0)."""

    name: str
    layers: int
    width: int
    heads: int
    kv_heads: int
    head_dim: int
    ff: int                    # dense MLP width
    vocab: int
    experts: int = 0
    top_k: int = 0
    shared: int = 0
    moe_ff: int = 0
    dense_layers: int = 0      # leading dense layers of a MoE model

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def attention_params(self) -> int:
        return self.width * (self.heads + 2 * self.kv_heads) * self.head_dim + \
            self.heads * self.head_dim * self.width

    def expert_params(self) -> int:
        return 3 * self.width * self.moe_ff

    def total_params(self) -> int:
        dense = (self.layers - self.moe_layers) * 3 * self.width * self.ff
        moe = self.moe_layers * (self.experts + self.shared) * self.expert_params()
        return self.layers * self.attention_params() + dense + moe + 2 * self.vocab * self.width

    def active_params(self) -> int:
        dense = (self.layers - self.moe_layers) * 3 * self.width * self.ff
        moe = self.moe_layers * (self.top_k + self.shared) * self.expert_params()
        return self.layers * self.attention_params() + dense + moe + self.vocab * self.width


SHAPES = {
    "llada-8b": Shape("LLaDA-8B", 32, 4096, 32, 32, 128, 12288, 126464),
    "llada2-flash": Shape("LLaDA2-flash", 32, 4096, 32, 4, 128, 9216, 157184, experts=256,
                          top_k=8, shared=1, moe_ff=1024, dense_layers=1),
}


@dataclass(frozen=True)
class Step:
    """One decode step: `batch` canvases feeding `rows` rows each, attending `keys` columns,
    returning logits for `window` rows; weights and activations `dtype_bytes` wide."""

    batch: int
    rows: int
    window: int
    keys: int
    dtype_bytes: int = 2


def collectives(shape: Shape, step: Step, tp: int) -> list[tuple[str, int]]:
    """(op, payload bytes this rank contributes) of one TP forward, in the plan's order."""
    if tp == 1:
        return []
    tokens = step.batch * step.rows
    out: list[tuple[str, int]] = [("all_reduce", tokens * shape.width * step.dtype_bytes)]
    for layer in range(shape.layers):
        moe = shape.experts and layer >= shape.dense_layers
        out.append(("all_reduce", tokens * shape.width * step.dtype_bytes))
        out.append(("all_reduce", tokens * shape.width * (4 if moe else step.dtype_bytes)))
    local_vocab = -(-shape.vocab // tp)
    out.append(("all_gather_into_tensor", step.batch * step.window * local_vocab * step.dtype_bytes))
    return out


def flops(shape: Shape, step: Step, tp: int) -> float:
    """Multiply-add FLOPs one rank does: 1/t of the sharded work (heads, MLP widths, the
    routed experts' expected share, the head's vocabulary slice); the router and the shared
    experts in full (they are replicated)."""
    tokens = step.batch * step.rows
    attention = shape.layers * (2 * tokens * shape.attention_params()
                                + 4 * tokens * step.keys * shape.heads * shape.head_dim)
    dense = (shape.layers - shape.moe_layers) * 2 * tokens * 3 * shape.width * shape.ff
    routed = shape.moe_layers * 2 * tokens * shape.top_k * shape.expert_params()
    replicated = shape.moe_layers * 2 * tokens * (shape.shared * shape.expert_params()
                                                  + shape.experts * shape.width)
    head = 2 * step.batch * step.window * shape.vocab * shape.width
    return (attention + dense + routed + head) / tp + replicated


def weight_bytes(shape: Shape, step: Step, tp: int) -> float:
    """Bytes one rank reads: its weight shards (routed experts: those any token chose, in
    expectation), the replicated parts, and its heads' K/V."""
    b = step.dtype_bytes
    kv_local = shape.kv_heads / tp if shape.kv_heads % tp == 0 else 1
    attention = shape.width * (shape.heads / tp + 2 * kv_local) * shape.head_dim + \
        shape.heads / tp * shape.head_dim * shape.width
    tokens = step.batch * step.rows
    dense = (shape.layers - shape.moe_layers) * 3 * shape.width * shape.ff / tp
    moe = 0.0
    if shape.experts:
        touched = 1 - (1 - shape.top_k / shape.experts) ** tokens
        moe = shape.moe_layers * ((shape.experts / tp) * touched * shape.expert_params()
                                  + shape.shared * shape.expert_params() + shape.experts * shape.width)
    head = shape.vocab * shape.width / tp
    kv = 2 * shape.layers * kv_local * shape.head_dim * step.keys * step.batch
    return (shape.layers * attention + dense + moe + head + kv) * b


def link_seconds(op: str, payload: int, tp: int, link: Link) -> float:
    if op == "all_reduce":
        return link.latency + 2 * (tp - 1) / tp * payload / link.bandwidth
    return link.latency + (tp - 1) * payload / link.bandwidth


@dataclass(frozen=True)
class Prediction:
    shape: str
    link: str
    batch: int
    rows: int
    tp: int
    all_reduces: int
    all_reduce_mb: float       # payload per rank per step, MB
    gather_mb: float
    compute_ms: float          # this rank's compute floor
    weights_ms: float          # this rank's weight-read floor
    comm_ms: float
    step_ms: float
    one_gpu_ms: float
    speedup: float = field(default=0.0)

    @property
    def efficiency(self) -> float:
        return self.speedup / self.tp


def predict(shape: Shape, step: Step, tp: int, link: Link, peaks: Peaks = PEAKS) -> Prediction:
    ops = collectives(shape, step, tp)
    comm = sum(link_seconds(op, size, tp, link) for op, size in ops)
    compute, weights = flops(shape, step, tp) / peaks.flops, weight_bytes(shape, step, tp) / peaks.memory
    one = max(flops(shape, step, 1) / peaks.flops, weight_bytes(shape, step, 1) / peaks.memory)
    total = max(compute, weights) + comm
    reduces = [size for op, size in ops if op == "all_reduce"]
    return Prediction(shape.name, link.name, step.batch, step.rows, tp, len(reduces),
                      sum(reduces) / 1e6, sum(s for op, s in ops if op != "all_reduce") / 1e6,
                      compute * 1e3, weights * 1e3, comm * 1e3, total * 1e3, one * 1e3,
                      one / total)


PAPER_STEPS = {"dual cache (block of 32 rows, 320 keys)": (32, 32, 320),
               "no cache (whole canvas, 288 rows)": (288, 32, 288)}
"""The steps the docs table shows: (rows fed, window, keys): a dual-cache step of one 32-row
block after a 64-token prompt and 256-token canvas, and the full-canvas step without a cache."""


def paper_table(shapes: tuple[str, ...] = ("llada-8b", "llada2-flash"),
                batches: tuple[int, ...] = (1, 16, 64), sizes: tuple[int, ...] = (2, 4, 8),
                links: tuple[str, ...] = ("nvlink", "pcie")) -> list[Prediction]:
    rows = []
    for name in shapes:
        for rows_fed, window, keys in PAPER_STEPS.values():
            for batch in batches:
                for tp in sizes:
                    for link in links:
                        rows.append(predict(SHAPES[name], Step(batch, rows_fed, window, keys), tp,
                                            LINKS[link]))
    return rows


def format_predictions(rows: list[Prediction]) -> str:
    """One line per (shape, step, batch, TP size), the links side by side."""
    head = ("| shape | rows fed | batch | TP | all-reduces | all-reduce MB | gather MB | "
            "compute ms | weights ms | 1 GPU ms | " + " | ".join(
                f"{name} comm ms | {name} speed-up" for name in _links(rows)) + " |")
    lines = [head, "|" + "---|" * (10 + 2 * len(_links(rows)))]
    grouped: dict[tuple[Any, ...], list[Prediction]] = {}
    for p in rows:
        grouped.setdefault((p.shape, p.rows, p.batch, p.tp), []).append(p)
    for (shape, rows_fed, batch, tp), group in grouped.items():
        p = group[0]
        links = " | ".join(f"{q.comm_ms:.2f} | {q.speedup:.2f}x ({q.efficiency:.0%})" for q in group)
        lines.append(f"| {shape} | {rows_fed} | {batch} | {tp} | {p.all_reduces} | "
                     f"{p.all_reduce_mb:.1f} | {p.gather_mb:.1f} | {p.compute_ms:.2f} | "
                     f"{p.weights_ms:.2f} | {p.one_gpu_ms:.2f} | {links} |")
    return "\n".join(lines)


def _links(rows: list[Prediction]) -> list[str]:
    return list(dict.fromkeys(p.link for p in rows))


# ---- the measurement -------------------------------------------------------------------------

@dataclass(frozen=True)
class TPOptions:
    """What `bench tp` measures (every count >= 1)."""

    shape: str = "llada-8b"
    layers: int | None = None
    device: str = "cpu"
    dtype: str = "bfloat16"
    batch: int = 16
    rows: int = 32
    window: int = 32
    repeats: int = 5
    link: str = "nvlink"
    paper: bool = False

    def __post_init__(self) -> None:
        from dllm_decode.eval.bench.shaped import SHAPES as BUILT

        if self.shape not in BUILT:
            raise ValueError(f"unknown shape {self.shape!r}; choose from {sorted(BUILT)}")
        if self.link not in LINKS:
            raise ValueError(f"unknown link {self.link!r}; choose from {sorted(LINKS)}")
        for name in ("batch", "rows", "window", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.window > self.rows:
            raise ValueError(f"window ({self.window}) cannot exceed the rows fed ({self.rows})")


def run_tp(options: TPOptions, say: Callable[[str], None] = lambda line: None) -> dict[str, Any] | None:
    """The paper model, and where a launcher started several ranks, the measurement (the report
    on rank 0; None on the other ranks, which print and write nothing)."""
    report: dict[str, Any] = {"paper": [vars(p) | {"efficiency": p.efficiency}
                                        for p in paper_table()] if options.paper else []}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if options.paper or world == 1:
        report["note"] = ("one process: the paper model only; launch with `torchrun "
                          "--nproc_per_node N -m dllm_decode bench tp` to measure")
        return report
    import torch

    from dllm_decode.eval.bench.shaped import ShapedOptions, shaped_model
    from dllm_decode.parallel import CollectiveCounter, init_parallel, shard_model, shutdown_parallel

    device = options.device
    if device.startswith("cuda") and "LOCAL_RANK" in os.environ:
        device = f"cuda:{os.environ['LOCAL_RANK']}"
        torch.cuda.set_device(torch.device(device))
    groups = init_parallel(world, device)
    try:
        built = ShapedOptions(shape=options.shape, layers=options.layers, device=device,
                              dtype=options.dtype, batch_sizes=(options.batch,))
        whole = shaped_model(built) if groups.tp_rank == 0 else None
        model = shard_model(shaped_model(built), groups)
        sizes = model.config
        ids = torch.randint(0, sizes.vocab_size - 3, (options.batch, options.rows),
                            generator=torch.Generator().manual_seed(0)).to(device)
        window = (options.rows - options.window, options.rows)
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

        def timed(run: Callable[[], Any]) -> float:
            sync()
            started = time.perf_counter()
            run()
            sync()
            return time.perf_counter() - started

        single: list[float] = []
        sharded: list[float] = []
        with torch.inference_mode():
            model(ids, rows=window)                                          # warm up
            if whole is not None:
                whole(ids, rows=window)
            for repeat in range(options.repeats):
                torch.distributed.barrier()
                if whole is not None:
                    single.append(timed(lambda: whole(ids, rows=window)))
                torch.distributed.barrier()
                sharded.append(timed(lambda: model(ids, rows=window)))
                if groups.rank == 0:
                    say(f"repeat {repeat + 1}/{options.repeats}")
            with CollectiveCounter() as counter:
                model(ids, rows=window)
        shape = Shape(options.shape, sizes.n_layers, sizes.d_model, sizes.n_heads,
                      sizes.kv_heads, sizes.d_model // sizes.n_heads,
                      sizes.mlp_hidden_size, sizes.vocab_size)
        step = Step(options.batch, options.rows, options.window, options.rows,
                    torch.finfo(getattr(torch, options.dtype)).bits // 8)
        planned = collectives(shape, step, groups.tp)
        predicted = predict(shape, step, groups.tp, LINKS[options.link])
        report.update({
            "world": world, "tp": groups.tp, "rank": groups.rank, "device": device,
            "shape": options.shape, "layers": sizes.n_layers, "dtype": options.dtype,
            "batch": options.batch, "rows": options.rows, "window": options.window,
            "repeats": options.repeats,
            "measured": {"counts": dict(counter.counts), "bytes": dict(counter.bytes)},
            "planned": {"counts": _tally(planned, lambda size: 1),
                        "bytes": _tally(planned, lambda size: size)},
            "one_gpu_ms": statistics.median(single) * 1e3 if single else None,
            "tp_ms": statistics.median(sharded) * 1e3,
            "predicted": vars(predicted) | {"efficiency": predicted.efficiency},
        })
        if single:
            report["speedup"] = report["one_gpu_ms"] / report["tp_ms"]
        return report if groups.rank == 0 else None
    finally:
        shutdown_parallel()


def _tally(ops: list[tuple[str, int]], value: Callable[[int], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, size in ops:
        out[op] = out.get(op, 0) + value(size)
    return out


def format_tp(report: dict[str, Any]) -> str:
    """The paper table (with `--paper`) or the measurement beside the model."""
    if not report:
        return ""
    lines = []
    if report.get("paper"):
        lines.append(format_predictions([_prediction(p) for p in report["paper"]]))
    if "tp_ms" in report:
        lines.append(f"{report['shape']} ({report['layers']} layers, {report['dtype']}) on "
                     f"{report['world']} x {report['device']}, batch {report['batch']}, "
                     f"{report['rows']} rows fed, window {report['window']}, "
                     f"{report['repeats']} repeats (medians)")
        lines.append(f"collectives per forward, measured: {report['measured']['counts']} "
                     f"bytes {report['measured']['bytes']}")
        lines.append(f"collectives per forward, planned:  {report['planned']['counts']} "
                     f"bytes {report['planned']['bytes']}")
        one = report.get("one_gpu_ms")
        lines.append(f"one device {one:.2f} ms, TP={report['tp']} {report['tp_ms']:.2f} ms: "
                     f"{report.get('speedup', math.nan):.2f}x (paper model on "
                     f"{report['predicted']['link']}: {report['predicted']['speedup']:.2f}x)")
    if report.get("note"):
        lines.append(report["note"])
    return "\n".join(lines)


def _prediction(row: dict[str, Any]) -> Prediction:
    return Prediction(**{k: v for k, v in row.items() if k != "efficiency"})
