"""The decoding a checkpoint ships with (`DecodeConfig.for_model`).

Where it comes from, first match wins:
1. the checkpoint's own `generation_config.json` key `decoding`: a `DecodeConfig.to_dict`-style
   mapping (the embedded models ship `{"scheduler": "threshold"}` there: the CLI's default);
2. DiffusionGemma: its `generation_config.json` sampler fields (`max_denoising_steps`, `t_min`,
   `t_max`, `stability_threshold`, `confidence_threshold`, `sampler_config.entropy_bound`; the
   reference's defaults for the unset ones) as the `uniform_noise` scheduler, one canvas per
   block, stopping at EOS only when the file names an `eos_token_id` (as the reference does);
3. the family's reference `generate` defaults, by the checkpoint's `model_type`:
   LLaDA (`generate.py`: `remasking='low_confidence'`, one token per step, block 128 or the whole
   canvas when 128 does not divide it), Dream (`diffusion_generate`: `alg='origin'`, random
   positions; here `random`, one token per step, one block), Fast-dLLM v2 (`batch_sample`:
   threshold 0.9 on its 32-token block), SDAR (JetAstra/SDAR@59549b1 `generate.py`
   `block_diffusion_generate`: `low_confidence_dynamic` at 0.85, block 4, steps 4), LLaDA2
   (`generate`: threshold 0.95, block 32, steps 32). Greedy throughout (the references' default
   temperature is 0; SDAR's is 1.0: here 0, a stated deviation).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FAMILY_DECODING: dict[str, tuple[dict[str, Any], str]] = {
    # model_type: (scheduler, block rule: "whole" canvas, "llada" 128-or-whole, "model" block)
    "llada": ({"name": "low_confidence"}, "llada"),
    "dream": ({"name": "random"}, "whole"),
    "fast_dllm_qwen": ({"name": "threshold", "threshold": 0.9}, "model"),
    "fast_dllm_llama": ({"name": "threshold", "threshold": 0.9}, "model"),
    "sdar": ({"name": "threshold", "threshold": 0.85}, "model"),
    "llada2_moe": ({"name": "threshold", "threshold": 0.95}, "model"),
    "llada21_moe": ({"name": "threshold", "threshold": 0.95}, "model"),
}
LLADA_BLOCK = 128
DEFAULT_BLOCK = 32
"""A checkpoint's own `decoding` without a block length: its model block, else 32 (or the whole
canvas when shorter), the CLI's default."""


def checkpoint_files(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The loaded model's config.json and generation_config.json ({} when absent or unreadable);
    a model built in memory: its config's `to_dict()`; a model named after no checkpoint (the
    CLI's `tiny`, `ideal`): nothing."""
    name = getattr(model, "name_or_path", None)
    if not name:
        config = getattr(getattr(model, "config", None), "to_dict", None)
        return (config() if callable(config) else {}), {}
    from dllm_decode.models.checkpoint import ModelLoadError, resolve_model_dir

    try:
        directory = resolve_model_dir(name)
    except (ModelLoadError, OSError, ValueError):
        return {}, {}
    out = []
    for file in ("config.json", "generation_config.json"):
        try:
            value = json.loads((Path(directory) / file).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            value = {}
        out.append(value if isinstance(value, dict) else {})
    return out[0], out[1]


def shipped_decoding(model: Any, gen_length: int) -> dict[str, Any]:
    """The `DecodeConfig.from_dict` mapping of the model's shipped decoding for `gen_length`
    tokens (see the module docstring).

    Raises:
        ValueError: a model whose family ships no decoding this package knows.
    """
    config, generation = checkpoint_files(model)
    own = generation.get("decoding")
    if isinstance(own, dict):
        block = getattr(model, "block_size", None) or min(DEFAULT_BLOCK, gen_length)
        return {"gen_length": gen_length, "block_length": block, **own}
    if getattr(model, "canvas_kind", "mask") == "noise":
        return noise_decoding(model, gen_length)
    model_type = str(config.get("model_type", "")).lower()
    if model_type not in FAMILY_DECODING:
        raise ValueError(f"no shipped decoding is known for model_type {model_type!r}; name a "
                         f"scheduler (known families: {sorted(FAMILY_DECODING)})")
    scheduler, rule = FAMILY_DECODING[model_type]
    if rule == "model":
        block = int(getattr(model, "block_size"))
    elif rule == "llada":
        block = LLADA_BLOCK if gen_length % LLADA_BLOCK == 0 else gen_length
    else:
        block = gen_length
    return {"scheduler": dict(scheduler), "gen_length": gen_length, "block_length": block}


def noise_decoding(model: Any, gen_length: int) -> dict[str, Any]:
    """DiffusionGemma's: its generation config as the `uniform_noise` scheduler (whole canvases)."""
    shipped = getattr(model, "generation_defaults", {}) or {}
    names = {"max_denoising_steps": "steps", "t_min": "t_min", "t_max": "t_max",
             "stability_threshold": "stability_threshold", "confidence_threshold": "confidence_threshold"}
    scheduler: dict[str, Any] = {"name": "uniform_noise",
                                 **{names[k]: v for k, v in shipped.items() if k in names}}
    sampler = shipped.get("sampler_config")
    if isinstance(sampler, dict) and sampler.get("entropy_bound") is not None:
        scheduler["entropy_bound"] = sampler["entropy_bound"]
    canvas = int(model.canvas_length)
    return {"scheduler": scheduler, "gen_length": math.ceil(gen_length / canvas) * canvas,
            "block_length": canvas, "stop_at_eos": "eos_token_id" in shipped}
