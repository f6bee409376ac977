"""One model forward, timed on its own: the cost of a full step against a cached one, eager
against `torch.compile`.

A decode's time is its forwards' times; these figures say what any mix of steps can reach. Each
call runs on the first block of a batch of prompts (canvas `[padding][prompt][MASK x G]`), under
`timing.interleave` like every other figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dllm_decode.eval.bench.timing import interleave


def first_block(model: Any, prompts: Sequence[str | list[int]], tokenizer: Any,
                gen_length: int) -> tuple[torch.Tensor, torch.Tensor | None, int, int]:
    """(canvas, attention mask, generation start, canvas width) for `prompts` at `gen_length`."""
    from dllm_decode.prompts import encode_prompts, left_pad

    ids = encode_prompts(list(prompts), tokenizer)
    canvas, mask = left_pad(ids, gen_length, model.mask_token_id, model.eos_token_ids[0],
                            torch.device("cpu"))
    return canvas, mask, canvas.shape[1] - gen_length, canvas.shape[1]


def median_ms(calls: dict[str, Callable[[], Any]], repeats: int,
              sync: Callable[[], None] | None = None) -> dict[str, float]:
    """Median milliseconds of each zero-argument call, the calls interleaved; `sync` (e.g.
    `torch.cuda.synchronize`) runs before and after each call, so queued device work is counted
    where it belongs."""
    def timed(call: Callable[[], Any]) -> Callable[[], Any]:
        if sync is None:
            return call
        sync()
        return lambda: (call(), sync())

    runs = interleave([(name, [call]) for name, call in calls.items()], repeats,
                      lambda label, index, call: timed(call))
    return {name: 1000 * r.seconds() for name, r in runs.items()}


def forward_costs(model: Any, prompts: Sequence[str | list[int]], tokenizer: Any, gen_length: int,
                  block_length: int, repeats: int = 5) -> dict[str, float]:
    """Median milliseconds of one forward at the first block: `full` (no cache, or a refresh),
    `prefix` (a prefix-cached step: rows [s, L)) and `dual` (a dual-cached step: rows
    [s, s + block)), with a K/V cache filled once beforehand."""
    from dllm_decode.models.layers import KVCache

    canvas, mask, start, length = first_block(model, prompts, tokenizer, gen_length)
    kv = KVCache.for_model(model)
    with torch.inference_mode():
        model(canvas, mask, kv=kv, rows=(start, length))
        return median_ms({"full": lambda: model(canvas, mask, rows=(start, length)),
                          "prefix": lambda: model(canvas, mask, kv=kv, rows=(start, length)),
                          "dual": lambda: model(canvas, mask, kv=kv, rows=(start, start + block_length))},
                         repeats)


def compile_speedup(model: Any, prompt: str | list[int], tokenizer: Any, gen_length: int,
                    block_length: int, repeats: int) -> dict[str, Any]:
    """Median milliseconds of one forward, eager vs `torch.compile` (static shapes), for a full
    step and a dual-cache step at batch 1, and the one-off compile seconds. Compiling takes
    minutes on CPU and recompiles for every new canvas width, which is why the loop runs eager."""
    from dllm_decode.models.layers import KVCache

    canvas, mask, start, length = first_block(model, [prompt], tokenizer, gen_length)
    rows = (start, start + block_length)
    with torch.inference_mode():
        kv = KVCache.for_model(model)
        model(canvas, mask, kv=kv, rows=(start, length))
        compiled = torch.compile(model.forward, dynamic=False)
        started = time.perf_counter()
        try:
            compiled(canvas, mask, rows=rows)
            compiled(canvas, mask, kv=kv, rows=rows)
        except Exception as err:                  # no compiler toolchain, unsupported op, ...
            return {"failed": f"{type(err).__name__}: {err}"[:300]}
        compile_seconds = time.perf_counter() - started
        ms = median_ms({"eager full": lambda: model(canvas, mask, rows=rows),
                        "eager dual": lambda: model(canvas, mask, kv=kv, rows=rows),
                        "compiled full": lambda: compiled(canvas, mask, rows=rows),
                        "compiled dual": lambda: compiled(canvas, mask, kv=kv, rows=rows)}, repeats)
    eager = {k: ms[f"eager {k}"] for k in ("full", "dual")}
    fast = {k: ms[f"compiled {k}"] for k in ("full", "dual")}
    return {"compile_seconds": compile_seconds, "eager_ms": eager, "compiled_ms": fast,
            "speedup": {k: eager[k] / fast[k] for k in eager}}


def runtime_speedup(model: Any, prompts: Sequence[str | list[int]], tokenizer: Any, gen_length: int,
                    block_length: int, repeats: int,
                    batch_sizes: Sequence[int] = (1,)) -> list[dict[str, Any]]:
    """The compact runtime against the reference blocks (`models/compact.py`), one forward at a
    time: a full forward (no cache: rows [s, L)), a full forward at mid-canvas (no cache, rows
    [s + G/2, L): the average block of a decode without cache, which the compact runtime's last
    block runs on those rows only) and a cached step (rows [s, s + block) against a K/V cache the
    same runtime filled), interleaved. Per batch size: median milliseconds per
    runtime and kind, the speedups, and how far the logits differ (max |difference| and whether
    every row's argmax agrees). Both runtimes use the same weights (`runtime_view`)."""
    from dllm_decode.devices import device_sync
    from dllm_decode.models.compact import DLLM_RUNTIMES
    from dllm_decode.models.layers import KVCache

    out = []
    views = {runtime: runtime_view(model, runtime) for runtime in DLLM_RUNTIMES}
    device = next(model.parameters()).device
    sync = device_sync(device)
    for batch in batch_sizes:
        canvas, mask, start, length = first_block(model, list(prompts)[:batch], tokenizer, gen_length)
        canvas, mask = canvas.to(device), (mask.to(device) if mask is not None else None)
        rows = {"full": (start, length), "mid": (start + gen_length // 2, length),
                "cached": (start, start + block_length)}
        calls, logits = {}, {}
        with torch.inference_mode():
            for runtime, view in views.items():
                kv = KVCache.for_model(model)
                view(canvas, mask, kv=kv, rows=rows["full"])
                calls[f"{runtime} full"] = lambda view=view: view(canvas, mask, rows=rows["full"])
                calls[f"{runtime} mid"] = lambda view=view: view(canvas, mask, rows=rows["mid"])
                calls[f"{runtime} cached"] = lambda view=view, kv=kv: view(canvas, mask, kv=kv,
                                                                          rows=rows["cached"])
                logits.update({name: call().float() for name, call in calls.items()
                               if name.startswith(runtime)})
            ms = median_ms(calls, repeats, sync)
        for kind in ("full", "mid", "cached"):
            ours, theirs = logits[f"compact {kind}"], logits[f"reference {kind}"]
            out.append({"batch": batch, "kind": kind, "rows": rows[kind][1] - rows[kind][0],
                        "reference_ms": ms[f"reference {kind}"], "compact_ms": ms[f"compact {kind}"],
                        "speedup": ms[f"reference {kind}"] / ms[f"compact {kind}"],
                        "max_abs_diff": float((ours - theirs).abs().max()),
                        "argmax_equal": bool(torch.equal(ours.argmax(-1), theirs.argmax(-1)))})
    return out


def runtime_view(model: Any, runtime: str) -> Any:
    """A shallow copy of `model` (the same parameters and modules) running in `runtime`, so two
    runtimes can be timed side by side without rebuilding the compact weights at each switch."""
    import copy

    from dllm_decode.models.compact import set_runtime

    return set_runtime(copy.copy(model), runtime)


def format_runtime(report: dict[str, Any]) -> str:
    """The `runtime_speedup` rows as a text table (and the profiles, when the report has them)."""
    lines = [f"compact runtime vs reference ({report['model']}, {report['dtype'][6:]} on "
             f"{report['device']}, {report['threads']} thread(s), gen {report['gen_length']}, block "
             f"{report['block_length']}, {report['repeats']} interleaved repeats; median ms per forward)",
             f"{'batch':>5}  {'forward':<22}{'reference ms':>13}{'compact ms':>12}"
             f"{'speedup':>9}{'max |dlogit|':>14}  argmax equal"]
    for r in report["runtime"]:
        what = {"full": f"full ({r['rows']} rows)", "mid": f"full, last {r['rows']} rows",
                "cached": f"cached {r['rows']}-row step"}[r["kind"]]
        lines.append(f"{r['batch']:>5}  {what:<22}{r['reference_ms']:>13.2f}{r['compact_ms']:>12.2f}"
                     f"{r['speedup']:>8.2f}x{r['max_abs_diff']:>14.1e}  "
                     f"{'yes' if r['argmax_equal'] else 'NO'}")
    return "\n".join(lines + report.get("profile", []))


def profile_runtime(model: Any, prompts: Sequence[str | list[int]], tokenizer: Any,
                    gen_length: int, block_length: int, calls: int = 10, top: int = 8) -> list[str]:
    """Where a forward's time goes in each runtime: the torch profiler's top ops by self CPU
    time over `calls` full forwards and `calls` cached steps, as text lines."""
    from torch.profiler import profile

    from dllm_decode.models.compact import DLLM_RUNTIMES
    from dllm_decode.models.layers import KVCache

    canvas, mask, start, length = first_block(model, prompts, tokenizer, gen_length)
    lines = []
    with torch.inference_mode():
        for runtime in DLLM_RUNTIMES:
            view = runtime_view(model, runtime)
            kv = KVCache.for_model(model)
            view(canvas, mask, kv=kv, rows=(start, length))
            for kind, rows, cache in (("full", (start, length), None),
                                      ("cached", (start, start + block_length), kv)):
                view(canvas, mask, kv=cache, rows=rows)
                with profile() as prof:
                    for _ in range(calls):
                        view(canvas, mask, kv=cache, rows=rows)
                table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
                lines += ["", f"profile: {runtime}, {kind} forward (rows {rows[1] - rows[0]}), "
                              f"{calls} calls", table]
    return lines
