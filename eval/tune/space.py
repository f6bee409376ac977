"""The tuner's search space: per rule, its main speed knob and a grid from conservative to
aggressive, along which accuracy is roughly monotone (non-increasing).

Grids are the published sweeps where there is one (ParallelBench's threshold sweep, the papers'
recommended ranges), cut to a handful of points. A knob may be a `DecodeConfig` field
(`block_length` for DUS) or `tokens_per_step` (fixed-count rules). Rules without a speed knob
(`pc_sampler`, `oracle`, `saber`, `wino`'s pair of bars, the wrappers) are not searched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from dllm_decode.eval.harness.grid import Setting

REFERENCE_RULE = "low_confidence"
"""One token per step: the budget's reference on a mask canvas."""

NOISE_REFERENCE_RULE = "uniform_noise"
"""The reference on a noise canvas (DiffusionGemma): the family's own entropy-bound rule at its
reference defaults (48 steps per canvas), since no rule commits one token per step there."""


@dataclass(frozen=True)
class Knob:
    """A rule's speed knob: `field` (a scheduler field, `block_length` or `tokens_per_step`) and
    its grid from conservative to aggressive; `fixed` are options held at set values."""

    field: str
    grid: tuple[str, ...]
    fixed: tuple[tuple[str, str], ...] = ()


SPACE: dict[str, Knob] = {
    "threshold": Knob("threshold", ("1.0", "0.95", "0.9", "0.85", "0.8", "0.7", "0.6", "0.5")),
    "factor": Knob("factor", ("0.5", "0.75", "1.0", "1.3", "1.6", "1.9")),
    "frechet": Knob("margin", ("0.5", "0.3", "0.25", "0.2", "0.1", "0.02")),
    "eb": Knob("gamma", ("0.001", "0.01", "0.1", "0.5", "1.0", "2.0")),
    "entropy_threshold": Knob("threshold", ("0.1", "0.2", "0.3", "0.4", "0.5", "0.7", "1.0")),
    "multi_block": Knob("threshold", ("0.1", "0.2", "0.3", "0.4", "0.5", "0.7", "1.0")),
    "hierarchy": Knob("low_threshold", ("0.9", "0.75", "0.62", "0.5", "0.4", "0.3")),
    "slowfast": Knob("high_threshold", ("1.0", "0.9", "0.8", "0.7", "0.6", "0.5")),
    "klass": Knob("confidence_threshold", ("0.95", "0.9", "0.8", "0.7")),
    "less": Knob("confidence", ("0.95", "0.9", "0.8", "0.7")),
    "local_leap": Knob("tau", ("0.9", "0.85", "0.8", "0.75", "0.7", "0.6")),
    "dus": Knob("block_length", ("1", "2", "4", "8", "16", "32")),
    "low_confidence": Knob("tokens_per_step", ("2", "4", "8")),
    "lsp": Knob("threshold", ("1.0", "0.95", "0.9", "0.85", "0.8", "0.7", "0.6", "0.5")),
    "dcd": Knob("threshold", ("1.0", "0.95", "0.9", "0.85", "0.8", "0.7", "0.6", "0.5")),
    "leap": Knob("low", ("0.9", "0.8", "0.7", "0.5", "0.3")),
    "said": Knob("steps_per_block", ("0", "24", "16", "12", "8", "6", "4")),   # 0: the block length
    "uniform_noise": Knob("steps", ("48", "32", "24", "16", "12", "8", "4")),    # decoder steps per canvas
}


SELF_BASE: dict[str, str] = {"s2d2": "threshold", "psd": "threshold", "simsd": "threshold"}
"""Self-speculative decoder -> the rule it drafts with, searched along that rule's knob (no
cache: they recompute the canvas). Strict modes only, the registry defaults: PSD's tokens are its
base rule's, S2D2's and SimSD's the block model's AR-mode decode, so only the forwards move."""


def chain(rule: str, cache: str, gen_length: int | None, block_length: int | None,
          grid: int | None = None) -> list[Setting]:
    """The rule's grid as settings, conservative first; a block-length knob keeps only the
    lengths that divide a block-diffusion model's `grid` (the sub-blocks it can decode)."""
    knob = SPACE[rule]
    out = []
    for value in knob.grid:
        if knob.field == "block_length" and grid is not None and grid % int(value):
            continue
        block = int(value) if knob.field == "block_length" else block_length
        options = knob.fixed if knob.field == "block_length" else (*knob.fixed, (knob.field, value))
        out.append(Setting(scheduler=rule, options=tuple(options), cache=cache, gen_length=gen_length,
                           block_length=block, swept=(knob.field,)))
    return out


def reference(gen_length: int | None, block_length: int | None, canvas: str = "mask") -> Setting:
    """One token per step (a noise canvas: its family's rule at its defaults), no cache, at the
    lengths searched."""
    rule = NOISE_REFERENCE_RULE if canvas == "noise" else REFERENCE_RULE
    return Setting(scheduler=rule, cache="none", gen_length=gen_length, block_length=block_length)


def runnable(rules: Sequence[str], canvas: str) -> tuple[list[str], list[str]]:
    """(the rules that run on a `canvas` canvas, those that do not), each rule's own
    `canvas_kinds` deciding; on a noise canvas the family's rule is searched too."""
    from dllm_decode.schedulers import SCHEDULERS

    names = [*rules, NOISE_REFERENCE_RULE] if canvas == "noise" and NOISE_REFERENCE_RULE not in rules else list(rules)
    kept = [r for r in names if canvas in SCHEDULERS[r].canvas_kinds]
    return kept, [r for r in names if r not in kept]


def check_rules(rules: Sequence[str]) -> None:
    """Raise a one-line `ValueError` for a rule with no speed knob in `SPACE`."""
    unknown = [r for r in rules if r not in SPACE]
    if unknown:
        raise ValueError(f"no tuning knob for {', '.join(unknown)}; searchable rules: {', '.join(sorted(SPACE))}")


def self_chain(decoder: str, gen_length: int | None, block_length: int | None) -> list[Setting]:
    """A self-decoder's grid: its base rule's (`SELF_BASE`) settings decoded by it."""
    return [dataclasses.replace(setting, self_decoder=decoder)
            for setting in chain(SELF_BASE[decoder], "none", gen_length, block_length)]


def self_decoders_for(decoder: object, gen_length: int | None, block_length: int | None) -> list[str]:
    """The self-decoders of `SELF_BASE` searched by default: none unless the model behind
    `decoder` (an eval `Decoder`) is a block-diffusion model, else those it takes, each by its
    own check on the first setting of its grid (`runner.check_settings`)."""
    from dllm_decode.eval.harness.runner import check_settings

    if not getattr(getattr(decoder, "model", None), "block_size", None):
        return []
    out = []
    for name in SELF_BASE:
        try:
            check_settings(decoder, self_chain(name, gen_length, block_length)[:1])
        except ValueError:
            continue
        out.append(name)
    return out
