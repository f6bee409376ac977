"""Tuned decoding presets: named combinations of the published policies with tuned settings.

The registered schedulers, caches and filters keep their papers' defaults; a preset is a
documented deviation chosen on this repository's task suite and embedded model with
`dllm-decode bench` (tuned on test examples of seed 1, reported on seed 0; see each `why`).
A preset is a partial decode record (the `DecodeConfig.from_dict` form, without lengths):
`PRESETS[name].config(gen_length=256, block_length=32)`.

`dllm-decode tune` writes tuned presets to a `presets.json` (one per task plus `overall`, each with
the model it was tuned on); `find_preset("FILE:NAME", model)` loads one and refuses it for another
model, `find_preset("NAME")` is a hand-written one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_decode.config import DecodeConfig


@dataclass(frozen=True)
class Preset:
    """A named partial decode record.

    Attributes:
        parts: `DecodeConfig.from_dict` keys this preset fixes (scheduler, cache, filters).
        why: what was measured to choose it.
    """

    parts: dict[str, Any] = field(default_factory=dict)
    why: str = ""

    def config(self, **fields: Any) -> DecodeConfig:
        """The full record: the preset's parts plus `fields` (gen_length, block_length, ...). A
        tuned fixed-count preset's `tokens_per_step` becomes `steps_per_block` on the block."""
        parts = {**self.parts, **fields}
        k = parts.pop("tokens_per_step", None)
        if k is not None:
            block = parts.get("block_length") or parts.get("gen_length", 1)
            parts["scheduler"] = {**parts["scheduler"], "steps_per_block": math.ceil(block / int(k))}
        return DecodeConfig.from_dict(parts)


EOTP = [{"name": "eotp"}]
_TUNING = ("chosen from hand sweeps of each field through dllm_decode.eval.bench on 4 test examples "
           "per target task (seed 1), gen 256, block 32, embedded model ff4b214 (the sweep script "
           "was not kept; `dllm-decode bench stack` re-measures the chosen presets)")

PRESETS: dict[str, Preset] = {
    # EB-sampler with a 100x looser entropy budget, plus EoTP. On the embedded model at gen 256,
    # truncating after the committed end of text also *raises* accuracy (the model saw long masked
    # tails rarely in training: 21 -> 36% for threshold), and gamma 0.1 keeps EB's accuracy
    # (seed 1: NFE 4.43 vs 6.68 at gamma 0.01, accuracy 39% vs 21% for one token per step).
    "eb_eotp": Preset({"scheduler": {"name": "eb", "gamma": 0.1}, "filters": EOTP}, why=_TUNING),
    # Fast-dLLM threshold lowered to 0.8 with EoTP: NFE 3.93 (1.75x the oracle) at +10.7 points
    # over one token per step on seed 1; 0.7 lost accuracy (-3.6), 0.6 more (-7.1).
    "threshold_0.8_eotp": Preset({"scheduler": {"name": "threshold", "threshold": 0.8},
                                  "filters": EOTP}, why=_TUNING),
    # Fast-dLLM factor rule at f = 1.5 with EoTP: the fewest steps that kept the mean (NFE 3.11,
    # 1.38x the oracle, +0.0 points on seed 1) but it loses Sudoku (-50 points on 4 examples).
    "factor_1.5_eotp": Preset({"scheduler": {"name": "factor", "factor": 1.5}, "filters": EOTP},
                              why=_TUNING),
}


MODEL_KEYS = ("config_sha256", "weights_sha256")


def load_tuned(path: str | Path) -> dict[str, Preset]:
    """The presets of a `dllm-decode tune` output file, by name (each task's, and `overall`)."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
        entries = document["presets"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a tuned presets file (dllm-decode tune's presets.json): {err}") from None
    model = document.get("model", {})
    return {name: Preset(entry["parts"], why=f"tuned by dllm-decode tune on {model.get('name', '?')} "
                                             f"({document.get('budget', '?')}); {path}")
            for name, entry in entries.items()}


def find_preset(text: str, model: dict[str, str] | None = None) -> Preset:
    """`NAME` (a hand-written preset) or `FILE:NAME` (a tuned one). With `model` (the identity
    `dllm-decode tune` records: name, config and weights hashes), a tuned preset recorded for
    another model is refused in one line."""
    if text in PRESETS:
        return PRESETS[text]
    path, sep, name = text.rpartition(":")
    if not sep or not path:
        raise ValueError(f"unknown preset {text!r}; known: {', '.join(sorted(PRESETS))}, or FILE:NAME "
                         f"for a tuned presets.json")
    tuned = load_tuned(path)
    if name not in tuned:
        raise ValueError(f"{path} has no preset {name!r}; it has {', '.join(sorted(tuned))}")
    if model is not None:
        recorded = json.loads(Path(path).read_text()).get("model", {})
        for key in MODEL_KEYS:
            if key in recorded and key in model and recorded[key] != model[key]:
                raise ValueError(f"preset {name!r} in {path} was tuned on another model ({key} differs "
                                 f"from {model.get('name', 'this one')}'s); re-run dllm-decode tune for it")
    return tuned[name]
