"""Tuned decoding presets: named combinations of the published policies with tuned settings.

The registered schedulers keep their papers' defaults; a preset is a documented deviation chosen
on this repository's task suite and embedded model by `dllm-decode bench` (see each `why`).
Build one with `PRESETS[name].scheduler()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_decode.interfaces import Scheduler
from dllm_decode.registry import build
from schedulers import SCHEDULERS


@dataclass(frozen=True)
class Preset:
    """A scheduler name with tuned options (registry syntax, dotted keys for components).

    Attributes:
        name: registry name of the scheduler.
        options: `(key, value)` pairs as `build` takes them.
        why: what was measured to choose it.
    """

    name: str
    options: tuple[tuple[str, str], ...] = ()
    why: str = ""

    def scheduler(self) -> Scheduler:
        return build(SCHEDULERS, self.name, dict(self.options))


PRESETS: dict[str, Preset] = {
    "threshold_0.7": Preset("threshold", (("threshold", "0.7"),),
                            "placeholder until measured on the embedded model"),
}
