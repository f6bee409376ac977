"""Tuned decoding presets: named combinations of the published policies with tuned settings.

The registered schedulers, caches and filters keep their papers' defaults; a preset is a
documented deviation chosen on this repository's task suite and embedded model with
`dllm-decode bench` (tuned on test examples of seed 1, reported on seed 0; see each `why`).
Build the parts with `PRESETS[name].scheduler()` and `PRESETS[name].filters()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_decode.interfaces import Filter, Scheduler
from dllm_decode.registry import build
from filters import FILTERS
from schedulers import SCHEDULERS

Options = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Preset:
    """A scheduler with tuned options (registry syntax, dotted keys for components) and filters.

    Attributes:
        name: registry name of the scheduler.
        options: `(key, value)` pairs as `build` takes them.
        filter_specs: `(filter name, options)` pairs, applied in order.
        why: what was measured to choose it.
    """

    name: str
    options: Options = ()
    filter_specs: tuple[tuple[str, Options], ...] = ()
    why: str = ""

    def scheduler(self) -> Scheduler:
        return build(SCHEDULERS, self.name, dict(self.options))

    def filters(self) -> tuple[Filter, ...]:
        return tuple(build(FILTERS, name, dict(options)) for name, options in self.filter_specs)


PRESETS: dict[str, Preset] = {
    "threshold_0.7": Preset("threshold", (("threshold", "0.7"),),
                            why="placeholder until measured on the embedded model"),
}
