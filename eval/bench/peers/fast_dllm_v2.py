"""Fast-dLLM v2's block loop, `batch_sample` (arXiv 2509.26328), driven unmodified.

Its signature (a method of `Fast_dLLM_QwenForCausalLM` in `v2/generation_functions.py` of
NVlabs/Fast-dLLM, bound to the model the way the checkout's own `v2/eval.py` binds it):
`batch_sample(self, input_ids, tokenizer, block_size, max_new_tokens, small_block_size, min_len,
seq_len, mask_id, threshold, stop_token, use_block_cache, top_p, temperature)`; it returns a
dict from prompt index to that prompt's canvas. Within a block it commits every masked position
whose probability exceeds `threshold`, and always the most probable one: at `threshold=1.0`
exactly one token per forward, the benchmark's policy only when `steps_per_block` equals the
block length (otherwise the row says so).

The model is the block-diffusion Qwen2 the release ships beside its weights (`modeling.py`,
`configuration.py`); the wrapper expects them under `v2/` of the checkout.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dllm_decode.eval.bench.peers._imports import peer_imports


class _Tokenizer:
    """The one tokenizer attribute `batch_sample` reads."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id


def load(root: Path, ours: Any, options: Any) -> Callable[[list[list[int]]], Any]:
    """`decode(prompts)` running the checkout's `batch_sample` on the batch.

    Raises:
        ImportError: the loop or the model files are missing or do not import here.
        ValueError: a policy `batch_sample` cannot run (steps per block below the block length).
    """
    from dllm_decode.eval.bench.outcome import Outcome

    if options.steps_per_block != options.block_length:
        raise ValueError(f"batch_sample commits at least one token per forward by threshold; it matches "
                         f"a fixed count only at one token per step (--steps-per-block {options.block_length})")
    with peer_imports(root / "v2") as load_module:
        functions = load_module("generation_functions")
        configuration = load_module("configuration")
        modeling = load_module("modeling")
    parameter = next(ours.parameters())
    config = configuration.Fast_dLLM_QwenConfig(**ours.config.to_dict())
    with torch.device(parameter.device):
        model = modeling.Fast_dLLM_QwenForCausalLM(config)
    model.load_state_dict(ours.state_dict(), strict=True)
    model = model.to(parameter.dtype).eval()
    model.batch_sample = types.MethodType(functions.Fast_dLLM_QwenForCausalLM.batch_sample, model)
    tokenizer = _Tokenizer(ours.config.pad_token_id)
    calls = [0]
    forward = model.forward

    def counted(*args: Any, **kwargs: Any) -> Any:           # batch_sample calls self.forward
        calls[0] += 1
        return forward(*args, **kwargs)

    model.forward = counted
    stop = -1                                        # never stop early: every row decodes gen_length

    def decode(prompts: list[list[int]]) -> Outcome:
        calls[0] = 0
        ids = torch.tensor(prompts, device=parameter.device)
        lengths = torch.full((len(prompts),), ids.shape[1], device=parameter.device)
        with torch.inference_mode():
            out = model.batch_sample(ids, tokenizer, options.block_length, options.gen_length,
                                     options.block_length, ids.shape[1], lengths, mask_id=ours.mask_token_id,
                                     threshold=1.0, stop_token=stop, use_block_cache=False, top_p=1.0,
                                     temperature=0.0)
        rows = [out[i][ids.shape[1]:ids.shape[1] + options.gen_length].tolist() for i in range(len(prompts))]
        return Outcome(None, calls[0], [calls[0]] * len(prompts), rows)

    return decode
