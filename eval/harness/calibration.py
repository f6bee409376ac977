"""Calibration inputs for quantizing a diffusion LM, from the eval tasks' train split (never the
test examples an eval scores).

Two sources, compared in `docs/guides/quantize.md`:
  * `decode`: the model decodes each prompt with a scheduler (the eval default, `threshold`)
    and every forward of the loop is recorded: canvases at the mask ratios and steps the decoder
    actually visits, as the dLLM quantization studies prescribe (DLLMQuant arXiv 2508.14090:
    samples across timesteps and mask ratios; Quant-dLLM arXiv 2510.03274: masked calibration).
  * `clean`: one forward over each prompt followed by its reference answer, nothing masked: the
    calibration text an autoregressive-LM tool would use.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_decode.prompts import chat_prompt
from dllm_decode.quant.calibrate import MAX_CALIBRATION, HessianRecorder

SOURCES = ("decode", "clean")


def calibration_examples(count: int, seed: int = 0, selection: str = "all") -> list[Any]:
    """`count` train-split examples cycling over the selected tasks (deterministic)."""
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.eval.tasks.sources import GROUPS

    if not 1 <= count <= MAX_CALIBRATION:
        raise ValueError(f"calibration count must be in [1, {MAX_CALIBRATION}], got {count}")
    names = [n for token in selection.split(",") if token.strip()
             for n in GROUPS.get(token.strip(), (token.strip(),))]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise ValueError(f"unknown calibration task(s) {unknown}; choose from {sorted(TASKS)} "
                         f"or {sorted(GROUPS)}")
    per_task = -(-count // len(names))
    pools = [TASKS[name].examples("train", per_task, seed) for name in names]
    mixed = [pool[i] for i in range(per_task) for pool in pools if i < len(pool)]
    return mixed[:count]


def record_hessians(model: Any, source: str, examples: list[Any], scheduler: str = "threshold",
                    gen_length: int = 32, batch_size: int = 8,
                    chat_template: bool = True) -> HessianRecorder:
    """Run `model` (float) over the calibration `examples` as `source` says, under a
    `HessianRecorder`; returns it (per layer: the Hessian and its row count)."""
    if source not in SOURCES:
        raise ValueError(f"calibration source must be one of {list(SOURCES)}, got {source!r}")
    tokenizer = model.tokenizer
    recorder = HessianRecorder(model)
    with recorder, torch.inference_mode():
        if source == "decode":
            from dllm_decode.eval.harness.grid import Setting
            from dllm_decode.eval.harness.runner import diffusion_decoder

            decode = diffusion_decoder(model, chat_template)
            setting = Setting(scheduler=scheduler)
            generator = torch.Generator().manual_seed(0)
            for start in range(0, len(examples), batch_size):
                batch = examples[start:start + batch_size]
                decode([e.prompt for e in batch], setting, gen_length, generator)
        else:
            for example in examples:
                prompt = tokenizer(chat_prompt(tokenizer, example.prompt, chat_template))["input_ids"]
                answer = tokenizer(" " + example.answer, add_special_tokens=False)["input_ids"]
                model(torch.tensor([prompt + answer], device=_device(model)))
    return recorder


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device
