"""Every registered rule either runs on a uniform-noise canvas (it declares "noise" in
`canvas_kinds`: it then chooses the columns to accept each step) or is refused there in one line."""

from __future__ import annotations

import warnings

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import Scheduler
from dllm_decode.sampler import generate
from dllm_decode.schedulers import MASK_SCHEDULERS, NOISE_SCHEDULERS, SCHEDULERS
from dllm_decode.testing import tiny_diffusion_gemma

STEPS = 4


@pytest.fixture(scope="module")
def model():
    return tiny_diffusion_gemma(steps=STEPS)


def test_at_least_half_of_the_confidence_rules_run_on_a_noise_canvas():
    rules = [name for name in MASK_SCHEDULERS]
    on_noise = [name for name in rules if name in NOISE_SCHEDULERS]
    assert 2 * len(on_noise) >= len(rules), on_noise


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_each_rule_runs_on_a_noise_canvas_or_is_refused_in_one_line(model, name):
    rule = SCHEDULERS[name]()
    config = DecodeConfig(rule, gen_length=16, block_length=8, stop_at_eos=False)
    if name not in NOISE_SCHEDULERS:
        with pytest.raises(ValueError, match="does not run on a noise canvas") as err:
            generate(model, [[5, 6, 7]], config)
        assert "\n" not in str(err.value)
        return
    # the noise loop calls `select` only: a rule declaring "noise" must need no other hook
    cls = type(rule)
    assert cls.process_logits is Scheduler.process_logits and cls.block_end is Scheduler.block_end
    assert rule.revises == "none" and rule.guide is None and not rule.needs_noise
    assert not rule.lookahead_candidates and not rule.chooses_block_bounds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # pc_sampler: no frequency table for vocab 128
        first = generate(model, [[5, 6, 7], [9, 4]], config, generator=torch.Generator().manual_seed(3))
        again = generate(model, [[5, 6, 7], [9, 4]], config, generator=torch.Generator().manual_seed(3))
    assert first.tokens.shape == (2, 16) and bool(((first.tokens >= 0) & (first.tokens < 128)).all())
    assert torch.equal(first.tokens, again.tokens)                       # seeded: repeats
    steps = STEPS if name != "uniform_noise" else 48
    assert bool((first.nfe >= 2 + 2).all()) and bool((first.nfe <= 2 + 2 * steps).all())


def test_capture_a_forward_cannot_serve_runs_eagerly_and_says_why(model):
    """The experts' `loop` form syncs the host per layer: the decoder forward runs eagerly, with
    one `CaptureFallback` line naming the fix (the masked families' fallback, same words)."""
    from dllm_decode.capture import CaptureFallback

    config = DecodeConfig(SCHEDULERS["uniform_noise"](steps=2), gen_length=8, block_length=8)
    eager = generate(model, [[5, 6, 7]], config, generator=torch.Generator().manual_seed(1))
    with pytest.warns(CaptureFallback, match="set_moe_impl") as caught:
        captured = generate(model, [[5, 6, 7]], config, generator=torch.Generator().manual_seed(1),
                            capture="static")
    assert torch.equal(eager.tokens, captured.tokens)
    assert all("\n" not in str(w.message) for w in caught)


@pytest.mark.parametrize("prompts, message", [
    ([[]], "prompt 0 is empty"),
    ([[5, 999]], "token id 999, outside the vocabulary"),
    ([[5] * 131070], "exceeds the model's context"),
])
def test_bad_prompts_are_one_line(model, prompts, message):
    config = DecodeConfig(SCHEDULERS["uniform_noise"](steps=1), gen_length=8, block_length=8)
    with pytest.raises(ValueError, match=message) as err:
        generate(model, prompts, config)
    assert "\n" not in str(err.value)


def test_a_step_trace_is_refused_in_one_line(model):
    config = DecodeConfig(SCHEDULERS["uniform_noise"](steps=1), gen_length=8, block_length=8)
    with pytest.raises(ValueError, match="records no step trace"):
        generate(model, [[5, 6]], config, trace=True)


@pytest.mark.parametrize("stability, confidence, steps_per_canvas", [(1, 0.005, STEPS), (0, 100.0, 1)])
def test_draws_are_one_randint_then_a_multinomial_and_a_randint_per_step(model, monkeypatch, stability,
                                                                         confidence, steps_per_canvas):
    """The reference's order: per canvas `randint` (the noise), then per step `multinomial`
    (the sample) and `randint` (the re-noise, drawn on the stopping step too); stability 0 and
    confidence threshold 100 stop after the first step: 1 + 2 * 1 draws per canvas."""
    calls = []
    for name in ("randint", "multinomial"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    scheduler = SCHEDULERS["uniform_noise"](steps=STEPS, stability_threshold=stability,
                                            confidence_threshold=confidence)
    generate(model, [[5, 6, 7]], DecodeConfig(scheduler, gen_length=16, block_length=8, stop_at_eos=False),
             generator=torch.Generator().manual_seed(0))
    canvas = ["randint"] + ["multinomial", "randint"] * steps_per_canvas
    assert calls == canvas * 2
