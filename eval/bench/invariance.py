"""Batch invariance on a device: does a request's answer depend on what it is batched with?

The device script's `invariance` stage. A set of prompts of different lengths is decoded greedily
through the serving `Engine` (a) each alone, (b) all admitted together (left padding to the
longest), (c) admitted together in reversed order, and (d) in reversed order with half of them
joining the running batch a step or two later (at its next block boundary). Each plan's tokens are
compared with (a): the fraction of requests whose tokens differ and the fraction of tokens.

Each row runs under one numerical option, set for the whole decode (process-wide torch settings
or a dispatch mode; nothing in the models changes), so the rows isolate which kernel's change
breaks invariance and what restores it, with each option's step time against the default's,
timed side by side in the same stage:

- `default`: the model's dtype, torch's defaults (cuBLAS picks a GEMM algorithm per shape; SDPA
  picks its back end per call).
- `no_reduced_precision`: `torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction =
  False` (split-K partial sums of bf16 GEMMs kept in float32).
- `sdpa_math`: scaled-dot-product attention pinned to the math back end
  (`torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`): the attention kernel isolated.
- `fixed_matmul`: every `aten.linear`/`mm`/`addmm` (the linear layers) computed in row tiles of one
  fixed height (`FixedShapeMatmul`): cuBLAS sees one shape per weight whatever the batch, so its
  algorithm (and reduction order) no longer follows the batch's row count. The pure-torch analogue
  of the batch-invariant GEMM of thinking-machines-lab/batch_invariant_ops.
- `fixed_matmul+sdpa_math`: both.
- `dispatch_only`: the same dispatch mode tiling nothing: the Python cost per op that
  `fixed_matmul`'s step time includes (a kernel-level version would not pay it).
- `float32`: the model cast to float32 with TF32 off (rounding 2^16 times finer, not a fixed
  reduction order: differences shrink, they need not vanish).

Known in float32 on the CPU (tests/test_batch_invariance.py): 0 differing tokens in every plan,
except (d) under the approximate K/V caches of bidirectional models (`prefix`, `dual`): a joining
request widens the window the batch's rows share. Rows say so (`known_variant`).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

OPTIONS = {
    "default": "the model's dtype, torch's defaults",
    "no_reduced_precision": "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False",
    "sdpa_math": "torch.nn.attention.sdpa_kernel(SDPBackend.MATH)",
    "fixed_matmul": "aten.linear/mm/addmm in fixed-height row tiles (FixedShapeMatmul)",
    "fixed_matmul+sdpa_math": "both",
    "dispatch_only": "FixedShapeMatmul's dispatch mode, tiling nothing (its Python cost per op)",
    "float32": "the model in float32, TF32 off",
}
PLANS = ("together", "reversed", "joining")
APPROXIMATE = {"prefix", "dual"}
"""Caches whose rows share a window they refresh together on a bidirectional model: a request that
joins mid-decode changes it, so `joining` varies even in float32 (known, not measured here)."""


@dataclass(frozen=True)
class InvarianceOptions:
    """What the stage decodes.

    Attributes:
        device: where (`cuda`, or `cpu` for `--quick`).
        dtype: the models' dtype for every option but `float32`.
        shape: the random-weight shape (`bench shaped`'s `SHAPES`), cut to `layers` layers: the
            width sets the GEMM shapes (and so the kernels), the depth only compounds them.
        prompt_lengths: one prompt per length (different lengths: different padding).
        embedded: also decode the shipped trained models (`embedded`, `embedded-bd`).
        tile: `FixedShapeMatmul`'s rows per GEMM.
        repeats: timed decodes per option (interleaved; the median is kept).
    """

    device: str = "cuda"
    dtype: str = "bfloat16"
    shape: str = "llada-8b"
    layers: int = 8
    prompt_lengths: tuple[int, ...] = (64, 53, 40, 27)
    gen_length: int = 64
    block_length: int = 32
    steps_per_block: int = 8
    embedded: bool = True
    tile: int = 256
    repeats: int = 3
    options: tuple[str, ...] = tuple(OPTIONS)

    def __post_init__(self) -> None:
        if len(self.prompt_lengths) < 2 or min(self.prompt_lengths) < 1:
            raise ValueError(f"prompt_lengths needs at least 2 lengths >= 1, got {list(self.prompt_lengths)}")
        if self.tile < 1 or self.repeats < 1 or self.layers < 1:
            raise ValueError(f"tile, repeats and layers must be >= 1, got {self.tile}, {self.repeats}, {self.layers}")
        if unknown := set(self.options) - set(OPTIONS):
            raise ValueError(f"unknown option(s) {sorted(unknown)}; choose from {list(OPTIONS)}")


class FixedShapeMatmul(TorchDispatchMode):
    """Every `aten.linear` (its rows flattened), `aten.mm` and `aten.addmm` split into row tiles of
    `tile` rows (the last one padded with zeros), so each GEMM a weight takes part in has one shape
    whatever the batch: the library chooses one algorithm for it, and a row's dot products are
    reduced in one order. Costs the padding (a step whose rows are fewer than `tile`) and one
    weight read per tile. A tile near the device's ridge point (bf16 FLOPs over bytes: about 300
    rows on an H100) keeps both small."""

    def __init__(self, tile: int | None = 256):
        super().__init__()
        self.tile = tile
        """Rows per GEMM; None: every op passes through untouched (the mode's own cost)."""
        self.calls = 0
        self.heights: set[int] = set()
        """The row counts of the GEMMs issued (one: `tile`)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self.tile is None:
            return func(*args, **kwargs)
        if func is torch.ops.aten.linear.default:        # reaches the mode whole under inference_mode
            self.calls += 1
            x, weight, bias = (*args, None)[:3]
            rows = x.reshape(-1, x.shape[-1])
            out = self._tiled(rows, lambda part, _: torch.nn.functional.linear(part, weight, bias))
            return out.reshape(*x.shape[:-1], out.shape[-1])
        if func is torch.ops.aten.mm.default:
            self.calls += 1
            a, b = args
            return self._tiled(a, lambda part, rows: torch.mm(part, b))
        if func is torch.ops.aten.addmm.default:
            self.calls += 1
            bias, a, b = args
            per_row = bias.dim() == 2 and bias.shape[0] == a.shape[0] and a.shape[0] > 1

            def one(part: torch.Tensor, rows: slice) -> torch.Tensor:
                return torch.addmm(_padded(bias[rows], part.shape[0]) if per_row else bias, part, b, **kwargs)
            return self._tiled(a, one)
        return func(*args, **kwargs)

    def _tiled(self, a: torch.Tensor, call: Callable[[torch.Tensor, slice], torch.Tensor]) -> torch.Tensor:
        m = a.shape[0]
        padded = _padded(a, -(-m // self.tile) * self.tile)
        parts = [call(padded[i:i + self.tile], slice(i, min(i + self.tile, m)))
                 for i in range(0, padded.shape[0], self.tile)]
        self.heights.update(part.shape[0] for part in parts)
        return torch.cat(parts)[:m]


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` with zero rows appended up to `rows`."""
    return x if x.shape[0] == rows else torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


@contextlib.contextmanager
def _setting(owner: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def option_context(name: str, tile: int = 256) -> contextlib.ExitStack:
    """The torch settings of option `name`, entered (leave with `with` or `.close()`)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    stack = contextlib.ExitStack()
    if name == "no_reduced_precision":
        stack.enter_context(_setting(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False))
    if "sdpa_math" in name:
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    if "fixed_matmul" in name or name == "dispatch_only":
        stack.enter_context(FixedShapeMatmul(None if name == "dispatch_only" else tile))
    if name == "float32":
        stack.enter_context(_setting(torch.backends.cuda.matmul, "allow_tf32", False))
        stack.enter_context(_setting(torch.backends.cudnn, "allow_tf32", False))
    return stack


def plans(count: int) -> dict[str, list[tuple[int, int]]]:
    """(prompt index, the engine step before which it is added) per plan; `alone` is one plan per
    prompt, run separately."""
    back = list(reversed(range(count)))
    half = count // 2
    return {"together": [(i, 0) for i in range(count)], "reversed": [(i, 0) for i in back],
            "joining": [(i, 0) for i in back[:half]] + [(i, 1 + k % 2) for k, i in enumerate(back[half:])]}


def decode_plan(model: Any, config: Any, prompts: Sequence[Sequence[int]], plan: list[tuple[int, int]],
                max_batch: int) -> tuple[dict[int, list[int]], int]:
    """Each planned request's tokens through one `Engine`, and the engine steps it took."""
    from dllm_decode.engine import Engine
    from dllm_decode.serving import Request

    engine = Engine(model, tokenizer=None, max_batch_size=max_batch)
    waiting, names, tokens, step = sorted(plan, key=lambda p: p[1]), {}, {}, 0
    while waiting or engine.has_work:
        while waiting and waiting[0][1] <= step:
            index, _ = waiting.pop(0)
            names[f"r{index}"] = index
            engine.add(Request(f"r{index}", tuple(prompts[index]), config, follow=False))
        for update in engine.step():
            if update.output is not None:
                tokens[names[update.request_id]] = list(update.output.tokens)
        step += 1
    return tokens, engine.steps


def difference(got: dict[int, list[int]], alone: dict[int, list[int]]) -> dict[str, Any]:
    """Fractions of requests and of tokens (position by position, a length change counting its
    extra tokens) that differ from the requests decoded alone."""
    changed = tokens = 0
    for index, mine in got.items():
        ref = alone[index]
        changed += sum(a != b for a, b in zip(mine, ref)) + abs(len(mine) - len(ref))
        tokens += max(len(mine), len(ref))
    requests = [i for i in got if got[i] != alone[i]]
    return {"requests": len(got), "tokens": tokens, "differing_requests": len(requests) / len(got),
            "differing_tokens": changed / tokens if tokens else 0.0, "which": sorted(requests)}


def rows_for(subject: str, models: Callable[[str], Any], caches: Sequence[str], o: InvarianceOptions,
             say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every (cache, option) row of one model: invariance per plan, then the step time of the
    `together` decode, the options interleaved over `repeats`."""
    from dllm_decode import DecodeConfig
    from dllm_decode.caches import CACHES
    from dllm_decode.devices import device_sync
    from dllm_decode.engine import check_cache
    from dllm_decode.schedulers import LowConfidenceScheduler

    sync = device_sync(torch.device(o.device)) or (lambda: None)
    rows = []
    for cache in caches:
        config = DecodeConfig(scheduler=LowConfidenceScheduler(steps_per_block=o.steps_per_block),
                              cache=CACHES[cache](), gen_length=o.gen_length, block_length=o.block_length,
                              stop_at_eos=False)
        check_cache(models("default"), config)
        prompts = _prompts(models("default"), o.prompt_lengths)
        count, timers = len(prompts), {}
        for option in o.options:
            model = models(option)
            with option_context(option, o.tile), torch.inference_mode():
                alone: dict[int, list[int]] = {}
                for index in range(count):
                    alone.update(decode_plan(model, config, prompts, [(index, 0)], 1)[0])
                row = {"model": subject, "cache": cache, "option": option, "plans": {}}
                for name, plan in plans(count).items():
                    row["plans"][name] = difference(decode_plan(model, config, prompts, plan, count)[0], alone)
                    if name == "joining" and cache in APPROXIMATE and subject.startswith(("llada", "embedded@")):
                        row["plans"][name]["known_variant"] = True
            counted = [p for p in row["plans"].values() if not p.get("known_variant")]
            row["differing_requests"] = max(p["differing_requests"] for p in counted)
            row["differing_tokens"] = max(p["differing_tokens"] for p in counted)
            rows.append(row)
            timers[option] = (model, row, [])
            say(f"  {subject} {cache} {option}: differing requests {row['differing_requests']:.2f}, "
                f"tokens {row['differing_tokens']:.3f}")
        for _ in range(o.repeats):
            for option, (model, row, times) in timers.items():
                with option_context(option, o.tile), torch.inference_mode():
                    sync()
                    started = time.perf_counter()
                    _, steps = decode_plan(model, config, prompts, plans(count)["together"], count)
                    sync()
                    times.append(1000 * (time.perf_counter() - started) / steps)
        base = statistics.median(timers["default"][2]) if "default" in timers else None
        for option, (_, row, times) in timers.items():
            row["ms_per_step"] = statistics.median(times)
            row["x_default"] = row["ms_per_step"] / base if base else None
    return rows


def _prompts(model: Any, lengths: Sequence[int]) -> list[list[int]]:
    """One seeded random prompt per length, of ordinary tokens (never [MASK] or EOS)."""
    generator = torch.Generator().manual_seed(0)
    special = torch.tensor(sorted({model.mask_token_id, *model.eos_token_ids}))
    out = []
    for length in lengths:
        ids = torch.randint(0, model.vocab_size, (length,), generator=generator)
        out.append(ids.masked_fill(torch.isin(ids, special), 5).tolist())
    return out


def run_invariance(o: InvarianceOptions, say: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Every model's rows (a model that cannot load here is a note), and per model and cache the
    options under which no request's tokens moved (`restores`)."""
    from dllm_decode.eval.bench.forward import runtime_view
    from dllm_decode.eval.bench.shaped import ShapedOptions, shaped_model

    shaped = ShapedOptions(shape=o.shape, layers=o.layers, device=o.device, dtype=o.dtype,
                           block_length=o.block_length, gen_length=o.gen_length, prompt_length=max(o.prompt_lengths),
                           steps_per_block=o.steps_per_block)
    subjects: dict[str, tuple[Callable[[str], Any], tuple[str, ...]]] = {
        f"llada@{o.shape}x{o.layers}": (
            lambda dtype: runtime_view(shaped_model(replace(shaped, dtype=dtype)), "compact"), ("none", "dual")),
        f"block@{o.shape}x{o.layers}": (lambda dtype: shaped_model(replace(shaped, dtype=dtype), "block"), ("block",)),
    }
    if o.embedded:
        from dllm_decode.models.loading import load_model

        for name, caches in (("embedded", ("none", "dual")), ("embedded-bd", ("block",))):
            subjects[f"{name}@trained"] = (lambda dtype, n=name: load_model(n, dtype=dtype, device=o.device), caches)
    report: dict[str, Any] = {
        "dtype": o.dtype, "device": o.device, "prompt_lengths": list(o.prompt_lengths), "gen_length": o.gen_length,
        "block_length": o.block_length, "steps_per_block": o.steps_per_block, "tile": o.tile, "repeats": o.repeats,
        "options": {name: OPTIONS[name] for name in o.options},
        "torch_defaults": {"allow_bf16_reduced_precision_reduction":
                           torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
                           "allow_tf32": torch.backends.cuda.matmul.allow_tf32},
        "rows": [], "notes": {}, "restores": {}}
    for subject, (build, caches) in subjects.items():
        built: dict[str, Any] = {}

        def model(option: str, build: Callable[[str], Any] = build, built: dict[str, Any] = built) -> Any:
            dtype = "float32" if option == "float32" else o.dtype
            if dtype not in built:
                built[dtype] = build(dtype)
            return built[dtype]
        try:
            rows = rows_for(subject, model, caches, o, say)
        except (ImportError, OSError, ValueError, RuntimeError) as err:     # a model that cannot run here
            report["notes"][subject] = f"not available: {type(err).__name__}: {str(err).strip().splitlines()[0]}"
            say(f"  {subject}: {report['notes'][subject]}")
            continue
        finally:
            built.clear()
            if torch.device(o.device).type == "cuda":
                torch.cuda.empty_cache()
        report["rows"] += rows
        for cache in caches:
            report["restores"][f"{subject}@{cache}"] = [r["option"] for r in rows
                                                        if r["cache"] == cache and r["differing_requests"] == 0]
    return report


def format_invariance(report: dict[str, Any]) -> str:
    """One line per row: the differing fractions per plan and the step time against the default."""
    lines = [f"batch invariance ({report['dtype']} on {report['device']}): differing requests / tokens "
             f"against each request alone"]
    lines.append(f"{'model':<26} {'cache':<6} {'option':<23} " + " ".join(f"{p:>13}" for p in PLANS)
                 + f" {'ms/step':>8} {'x default':>9}")
    for r in report["rows"]:
        cells = " ".join(f"{r['plans'][p]['differing_requests']:>5.2f}/{r['plans'][p]['differing_tokens']:<6.3f}"
                         + ("*" if r["plans"][p].get("known_variant") else " ") for p in PLANS)
        ratio = f"{r['x_default']:.2f}x" if r.get("x_default") else "-"
        lines.append(f"{r['model']:<26} {r['cache']:<6} {r['option']:<23} {cells} {r['ms_per_step']:>8.2f} {ratio:>9}")
    lines += [f"{subject}: {note}" for subject, note in report["notes"].items()]
    lines.append("* known to vary in float32 too (an approximate cache with a request joining mid-decode)")
    return "\n".join(lines)
