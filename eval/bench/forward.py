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


def median_ms(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each zero-argument call, the calls interleaved."""
    runs = interleave([(name, [call]) for name, call in calls.items()], repeats,
                      lambda label, index, call: call)
    return {name: 1000 * r.seconds() for name, r in runs.items()}


def forward_costs(model: Any, prompts: Sequence[str | list[int]], tokenizer: Any, gen_length: int,
                  block_length: int, repeats: int = 5) -> dict[str, float]:
    """Median milliseconds of one forward at the first block: `full` (no cache, or a refresh),
    `prefix` (a prefix-cached step: rows [s, L)) and `dual` (a dual-cached step: rows
    [s, s + block)), with a K/V cache filled once beforehand."""
    from dllm_decode.models.layers import KVCache

    canvas, mask, start, length = first_block(model, prompts, tokenizer, gen_length)
    kv = KVCache()
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
        kv = KVCache()
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
