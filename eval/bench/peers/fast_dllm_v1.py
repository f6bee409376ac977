"""Fast-dLLM v1's dual-cache loop, `generate_with_dual_cache` (arXiv 2505.22618), driven unmodified.

Its signature (in `llada/generate.py` of NVlabs/Fast-dLLM): `generate_with_dual_cache(model,
prompt, steps, gen_length, block_length, temperature, remasking, mask_id, threshold)`, a prompt of
shape (1, P); it returns `(canvas, nfe)`. Per block it runs one full forward that refreshes the
K/V cache and then cached forwards over the block until the block has no [MASK]; `steps` over all
blocks with `threshold=None` commits `block_length / (steps / blocks)` tokens per forward by
confidence: the benchmark's `low_confidence` policy at `steps_per_block`.

The model is the checkout's own LLaDA class (`llada/model/modeling_llada.py`, its config from
`llada/model/configuration_llada.py`) built from this project's config and loaded with this
project's weights, on the same device and dtype.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dllm_decode.eval.bench.peers._imports import peer_imports

PARAMETERS = ("model", "prompt", "steps", "gen_length", "block_length", "temperature", "remasking", "mask_id")


def peer_model(configuration: Any, modeling: Any, ours: Any) -> Any:
    """The checkout's LLaDA (`modeling.LLaDAModelLM`, `configuration.LLaDAConfig`) with `ours`'
    config and weights, on its device and dtype.

    Raises:
        RuntimeError: the weights do not load (names or shapes differ).
    """
    parameter = next(ours.parameters())
    config = configuration.LLaDAConfig(**ours.config.to_dict())
    with torch.device(parameter.device):
        model = modeling.LLaDAModelLM(config)
    model.load_state_dict(ours.state_dict(), strict=True)
    return model.to(parameter.dtype).eval()


def load(root: Path, ours: Any, options: Any) -> Callable[[list[list[int]]], Any]:
    """`decode(prompts)` running the checkout's loop on each prompt (it decodes one at a time:
    a batch of several is refused, not looped, so its row never claims a batch it did not run).

    Raises:
        ImportError: `llada/generate.py` (or what it imports) does not import here.
        TypeError: its `generate_with_dual_cache` lacks the parameters this wrapper passes.
    """
    from dllm_decode.eval.bench.outcome import Outcome

    with peer_imports(root / "llada") as load_module:
        generate = load_module("generate").generate_with_dual_cache
        configuration = load_module("model.configuration_llada")
        modeling = load_module("model.modeling_llada")
    missing = [p for p in PARAMETERS if p not in inspect.signature(generate).parameters]
    if missing:
        raise TypeError(f"generate_with_dual_cache has no parameter(s) {missing}")
    model = peer_model(configuration, modeling, ours)
    blocks = options.gen_length // options.block_length
    device = next(ours.parameters()).device

    def decode(prompts: list[list[int]]) -> Outcome:
        if len(prompts) != 1:
            raise ValueError("generate_with_dual_cache decodes one prompt per call")
        prompt = torch.tensor(prompts, device=device)
        with torch.inference_mode():
            canvas, nfe = generate(model, prompt, steps=options.steps_per_block * blocks,
                                   gen_length=options.gen_length, block_length=options.block_length,
                                   temperature=0.0, remasking="low_confidence", mask_id=ours.mask_token_id,
                                   threshold=None)
        nfe = int(nfe)
        return Outcome(None, nfe, [nfe], canvas[:, -options.gen_length:].tolist())

    decode.batch_limit = 1
    return decode
