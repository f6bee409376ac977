"""The loop syncs with the host at most once per step, plus once per block start (a rule that
chooses its block ends reads them then).

Every tensor-to-host conversion (`item`, `tolist`, `cpu`, `numpy`, `bool()`, `int()`, `float()`,
`index`) made inside `Decoding.step` is counted, for every registered scheduler under each
cache, with the EoTP filter. On CPU these calls are cheap, but on an accelerator each one stalls
the queue, so the count is the portable measure.
"""

from __future__ import annotations

import dataclasses
import pytest
import torch

from dllm_decode.caches import CACHES
from dllm_decode import sampler
from dllm_decode.config import DecodeConfig, accepts_cache
from dllm_decode.sampler import generate
from dllm_decode.testing import tiny_llada
from dllm_decode.filters import EoTPFilter
from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS

CONVERSIONS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class SyncCounter:
    """Counts host conversions while `active`; also counts steps (forwards) and block starts."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.active = False
        self.syncs = self.forwards = self.blocks = self.steps = 0
        for name in CONVERSIONS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        step = sampler.Decoding.step

        def counted_step(decoding):
            self.blocks += decoding.block_step == 0
            self.steps += 1
            self.active = True
            try:
                step(decoding)
            finally:
                self.active = False

        monkeypatch.setattr(sampler.Decoding, "step", counted_step)

    def _counted(self, method):
        def wrapper(tensor, *args, **kwargs):
            if self.active:
                self.syncs += 1
                self.active = False          # a conversion's own internals are not more syncs
                try:
                    return method(tensor, *args, **kwargs)
                finally:
                    self.active = True
            return method(tensor, *args, **kwargs)
        return wrapper

    def model(self, inner):
        counter = self

        class Counting(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = inner
                self.mask_token_id, self.eos_token_ids = inner.mask_token_id, inner.eos_token_ids
                self.vocab_size, self.max_length = inner.vocab_size, inner.max_length
                self.supports_kv = inner.supports_kv
                self.ar_partner = getattr(inner, "ar_partner", None)

            def forward(self, *args, **kwargs):
                counter.forwards += 1
                return self.inner(*args, **kwargs)

        return Counting()


EXTRA_SYNCS = {"elastic": 1, "es": 1, "dllm_cache": 1}
"""Caches allowed more syncs per step, and why: Elastic-Cache reads on the host whether any row's
attention drifted and from which layer, to skip the refresh work when none did (one per step);
ES-dLLM reads the batch's largest per-row count, the width its skip layers keep (one per step);
dLLM-Cache keeps each row's step counter on the host (it decides which parts a step refreshes),
so when rows leave it reads which ones stay (at most once per step)."""

LAYERWISE = ("d2", "elastic", "dkv", "dllm_cache", "es")
"""Caches that run the model's layers themselves (no `forward` call to count): steps are counted."""


@pytest.mark.parametrize("cache", ["none", "dual", "d2", "elastic", "suffix", "dkv", "dllm_cache", "es"])
@pytest.mark.parametrize("name", sorted(MASK_SCHEDULERS))
def test_at_most_one_host_sync_per_step(monkeypatch, name, cache):
    if not accepts_cache(SCHEDULERS[name](), cache):
        pytest.skip("the rule refuses this cache (refused in one line, tested elsewhere)")
    counter = SyncCounter(monkeypatch)
    model = tiny_llada(layers=1) if cache in LAYERWISE else counter.model(tiny_llada(layers=1))
    config = DecodeConfig(scheduler=SCHEDULERS[name](), gen_length=16, block_length=8)
    config = dataclasses.replace(config, cache=CACHES[cache](), filters=(EoTPFilter(),))
    result = generate(model, [[1, 2, 3], [4, 5, 6, 7, 8], [9]], config)
    steps = counter.steps if cache in LAYERWISE else counter.forwards
    assert steps >= int(result.nfe.max()) > 0 and counter.blocks > 0
    # a look-ahead rule's consult reads on the host how many candidates to run, even in a step
    # where no row proposed one (then no look-ahead forward runs): one more per step
    ahead = 1 if config.scheduler.lookahead_candidates else 0
    allowed = (1 + EXTRA_SYNCS.get(cache, 0) + ahead) * steps + counter.blocks
    assert counter.syncs <= allowed, (
        f"{counter.syncs} host syncs for {steps} steps and {counter.blocks} block starts")


def test_counter_sees_a_sync(monkeypatch):
    """The counter is live: a scheduler that calls `.item()` each step is over budget."""
    from dllm_decode.interfaces import Decision
    from dllm_decode.schedulers import ThresholdScheduler

    class Chatty(ThresholdScheduler):
        def select(self, inp, state):
            float(inp.confidence.max().item())
            return Decision(commit=inp.confidence >= self.threshold), state

    counter = SyncCounter(monkeypatch)
    model = counter.model(tiny_llada(layers=1))
    generate(model, [[1, 2, 3]], DecodeConfig(scheduler=Chatty(), gen_length=16, block_length=8))
    assert counter.syncs > counter.forwards + counter.blocks
