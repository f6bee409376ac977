"""`generate` equals the reference loop token for token, for every commit-only scheduler in the
registry, greedy and sampled (the same generator seed on both sides)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.reference import reference_generate
from dllm_decode.sampler import generate
from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS
from dllm_decode.testing import tiny_llada

COMMIT_ONLY = sorted(name for name, cls in MASK_SCHEDULERS.items() if cls().revises == "none")


def test_the_registry_has_commit_only_schedulers():
    assert {"low_confidence", "threshold", "adaptive_block", "credit"} <= set(COMMIT_ONLY)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", COMMIT_ONLY)
def test_generate_equals_the_reference_loop(name, temperature):
    model = tiny_llada(seed=4)
    scheduler = SCHEDULERS[name]()
    for prompt, stop in (([1, 2, 3], True), ([7, 5], False)):
        config = DecodeConfig(scheduler, gen_length=16, block_length=8, temperature=temperature,
                              stop_at_eos=stop)
        got = generate(model, [prompt], config, generator=torch.Generator().manual_seed(11)).tokens[0]
        want = reference_generate(model, prompt, config, generator=torch.Generator().manual_seed(11))
        assert torch.equal(got, want), (name, prompt, got.tolist(), want.tolist())


def test_the_reference_refuses_what_it_does_not_model():
    from dllm_decode.caches import CACHES

    with pytest.raises(ValueError, match="commit-only"):
        reference_generate(tiny_llada(), [1], DecodeConfig(SCHEDULERS["low_confidence"](),
                                                          cache=CACHES["dual"](), gen_length=8,
                                                          block_length=8))
