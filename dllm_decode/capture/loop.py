"""`fused_generate`: a whole greedy decode whose every step is one captured graph
(`fused.fused_step`: forward, decision, write, status) and one host read of its status.

It serves the common case exactly as `sampler.generate` does (tokens, NFE, end-of-text stops,
the step cap): one request, a bidirectional model (LLaDA, Dream), the `none`, `prefix` or `dual`
cache, a scheduler with `capturable = True` and no other hooks, no filters, no trace. Sampling
noise is drawn on the host with the request's generator for its live rows, exactly as the eager
loop draws it, into a static buffer the graph reads, so sampled tokens equal eager's too.
`fused_problem` says why another configuration runs the per-step loop instead (which still runs
its model forward through the captured step). What the graph cannot hold stays on the host:
block bounds, refresh steps, end-of-text stops and the step cap, from the one status read.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from dllm_decode.capture.buckets import Buckets
from dllm_decode.capture.fused import STATUS_ROWS, fused_step
from dllm_decode.capture.graphs import GraphCache
from dllm_decode.capture.runtime import CapturedCache, cache_kind, capture_problem, graph_cache
from dllm_decode.config import DecodeConfig, DecodeResult
from dllm_decode.errors import NonFiniteLogits
from dllm_decode.interfaces import Scheduler
from dllm_decode.member import Member, check_request
from dllm_decode.models.compact import compact_stack
from dllm_decode.ops import aligned_uniform
from dllm_decode.prompts import left_pad


def fused_problem(config: DecodeConfig, model: Any, trace: bool = False) -> str | None:
    """Why `config` on `model` cannot run fused steps (a phrase), or None."""
    if (problem := capture_problem(config, model)) is not None:
        return problem
    scheduler = config.scheduler
    kind = type(scheduler)
    if not getattr(scheduler, "capturable", False):
        return f"scheduler {kind.__name__} is not capturable"
    for hook in ("process_logits", "block_end", "init_state", "step_budget"):
        if getattr(kind, hook, None) is not getattr(Scheduler, hook, None):
            return f"scheduler {kind.__name__} has its own {hook}"
    if getattr(scheduler, "lookahead_candidates", 0) or getattr(scheduler, "guide", None) or \
            getattr(scheduler, "needs_noise", False):
        return "the scheduler runs extra forwards or reads the sampling noise"
    if scheduler.revises != "none" or scheduler.view != "block" or scheduler.post_steps:
        return "the scheduler revises, edits after a block or looks past the block"
    if config.filters:
        return "filters run on the host"
    if trace:
        return "a trace records every step on the host"
    if getattr(model, "block_size", None):
        return "block-diffusion models decode on their grid (per-row blocks)"
    if cache_kind(config.cache) == "block":
        return "the block cache"
    return None


def fused_decoder(model: Any, config: DecodeConfig, capture: Any, trace: bool = False) -> Any:
    """`fused_generate` bound to the `GraphCache` that `capture` names, or None when `capture` is
    "off" or the configuration needs the per-step loop (`fused_problem`).

    Raises:
        TypeError / ValueError: a bad `capture` (see `runtime.graph_cache`).
    """
    graphs = graph_cache(capture)
    if graphs is None or fused_problem(config, model, trace) is not None:
        return None
    return lambda prompts, **kwargs: fused_generate(model, prompts, config, graphs, **kwargs)


def fused_generate(model: Any, prompts: Any, config: DecodeConfig, graphs: GraphCache, *,
                   generator: torch.Generator | None = None, tokenizer: Any = None) -> DecodeResult:
    """`sampler.generate` for a configuration `fused_problem` accepts, each step one graph."""
    ids, tokenizer = check_request(model, config.cache, prompts, config, generator, tokenizer)
    runtime = CapturedCache(config.cache, model, graphs)
    runtime.init_state(model)
    device = runtime.head.device
    mask_id, eos_ids = model.mask_token_id, tuple(model.eos_token_ids)
    canvas, attention = left_pad(ids, config.gen_length, mask_id, eos_ids[0], device)
    generator = generator if generator is not None else \
        torch.Generator(device=device).manual_seed(config.seed)
    member = Member(None, config, generator, tokenizer, out=canvas.clone(), live=len(ids),
                    nfe=torch.zeros(len(ids), dtype=torch.long, device=device), trace=None)
    rows, length = canvas.shape
    gen_start, block_length = length - config.gen_length, config.block_length
    runtime.buckets = Buckets(max_batch=graphs.max_batch, length_step=graphs.length_step,
                              block_length=block_length,
                              widths=(block_length + runtime.head.shift + 1,))
    stack = compact_stack(model)
    buffers = runtime._buffers(rows, length, stack=stack)
    buffers.load(canvas, attention)
    bucket = buffers.batch
    block, gen_span = buffers.static("block", (bucket, 2)), buffers.static("gen_span", (bucket, 2))
    step, num_steps = buffers.static("step", ()), buffers.static("num_steps", ())
    eos = buffers.static("eos", (len(eos_ids),))
    gen_span.copy_(torch.tensor([[gen_start, length]], device=device).expand(bucket, 2))
    eos.copy_(torch.tensor(eos_ids, device=device))
    nfe, done = [0] * rows, [False] * rows
    kind, cache = runtime.kind, config.cache
    for start in range(gen_start, length, block_length):
        end = min(start + block_length, length)
        block.copy_(torch.tensor([start, end], device=device).expand(bucket, 2))
        num_steps.fill_(end - start)
        block_step = 0
        while True:
            refresh = kind == "none" or block_step == 0 and start == gen_start or \
                (kind == "kv" and cache._refresh_due(block_step))
            fed = (0, buffers.length + 1) if refresh else (
                max(cache.rows((start, end), length)[0] - runtime.head.shift, 0),
                cache.rows((start, end), length)[1])
            step.fill_(block_step)
            draw = None
            if config.temperature > 0:       # the eager draws: the live rows, the rest of the answer
                live = [i for i in range(rows) if not done[i]]
                draw = lambda noise, live=live, start=start, end=end: _draw(   # noqa: E731
                    noise, live, start, length - start, end - start, generator)
            status = _run(runtime, graphs, stack, buffers, fed, (start, end), block, gen_span,
                          step, num_steps, eos, config.scheduler, mask_id,
                          draw=draw, temperature=config.temperature)
            block_left, gen_left, block_eos, worked, nonfinite = (
                s[:rows] for s in status.tolist())                 # the one host sync of the step
            if any(nonfinite):
                raise NonFiniteLogits.of(model, [i for i, bad in enumerate(nonfinite) if bad])
            for i in range(rows):
                if not done[i]:
                    nfe[i] += worked[i]
                    stop = config.stop_at_eos and not block_left[i] and block_eos[i]
                    if stop:
                        buffers.canvas[i, end:length] = eos_ids[0]
                    done[i] = stop or not gen_left[i]
            block_step += 1
            if not any(block_left[i] for i in range(rows) if not done[i]):
                break
            if block_step > end - start + 1:
                raise RuntimeError("a block still has masks after one step per position: a "
                                   "scheduler or filter broke the progress rule")
        if all(done):
            break
    member.out = buffers.canvas[:rows, :length].clone()
    member.nfe = torch.tensor(nfe, device=device)
    member.seconds = time.perf_counter() - member.started
    return member.result(eos_ids)


def _draw(noise: Tensor, live: list[int], start: int, span: int, width: int,
          generator: torch.Generator) -> None:
    """The request's U(0, 1) draws for its live rows' region `[start, start + span)` (as the
    eager step draws them: `ops.aligned_uniform`), laid into the noise buffer's window."""
    device = noise.device
    starts = torch.full((len(live),), start, dtype=torch.long, device=device)
    draws = aligned_uniform(starts, span, start, width, generator, vocab=noise.shape[-1],
                            dtype=torch.float64)
    noise.fill_(float("nan"))
    noise[torch.tensor(live, device=device), :width] = draws


def _run(runtime: CapturedCache, graphs: GraphCache, stack: Any, buffers: Any, fed: tuple[int, int],
         window: tuple[int, int], *tail: Any, draw: Any = None, temperature: float = 0.0) -> Tensor:
    """Write the window's indices (and the sampling noise: `draw`) and run the bucket's fused
    graph; returns its status."""
    width, limit = buffers.length, buffers.length + 1
    fed_count, out_count = fed[1] - fed[0], window[1] - window[0]
    # a window always feeds one scratch row too: padded window columns read and write it
    fed_width = runtime.buckets.width(fed_count if fed[1] == limit else fed_count + 1, limit)
    out_width = runtime.buckets.width(out_count, limit)
    device = buffers.canvas.device
    columns = torch.arange(fed_width, device=device) + fed[0]
    buffers.index("fed", fed_width).copy_(torch.where(columns < fed[1], columns, width))
    slots = torch.arange(out_width, device=device)
    out = torch.where(slots < out_count, slots + (window[0] - fed[0]), fed_width - 1)
    buffers.index("out", out_width).copy_(out)
    buffers.index("prev", out_width).copy_((out - 1).clamp_min(0))
    stack.rotary.reserve(max(runtime.max_length, width) + 1)
    cos, sin = stack.rotary.tables
    args = (stack, runtime.head, cos, sin, buffers.canvas, buffers.attention, buffers.kv.keys,
            buffers.kv.values, buffers.index("fed", fed_width), buffers.index("out", out_width),
            buffers.index("prev", out_width), *tail)
    noise = None
    if draw is not None:
        noise = buffers.static("noise", (buffers.batch, out_width, runtime.head.vocab),
                               torch.float64)
        draw(noise)
    args = (*args, noise, temperature)
    key = ("fused", buffers.batch, width, fed_width, out_width, tail[-2], temperature)
    return graphs.run(key, (id(stack), cos.data_ptr()), args, fn=fused_step)
