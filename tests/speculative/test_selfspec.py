"""dLLM self-speculation returns the model's own stepwise output (`generate`) token for token, in
fewer forwards, and refuses decodes it cannot replay."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.sampler import generate
from dllm_decode.speculative.selfspec import self_speculative_generate
from dllm_decode.testing import OracleMaskPredictor, tiny_block_diffusion, tiny_llada
from dllm_decode.schedulers import (CreditScheduler, LowConfidenceScheduler, RandomScheduler,
                                    ThresholdScheduler)
from dllm_decode.caches import PrefixCache

PROMPTS = ([3, 17, 5, 9], [8, 2, 8, 2, 8, 30, 11], [1])


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=2)


@pytest.mark.parametrize("gen,block", [(12, 12), (12, 4), (12, 3)])
@pytest.mark.parametrize("stop_at_eos", [True, False])
@pytest.mark.parametrize("draft_steps,branch", [(4, 1), (8, 2)])
def test_equals_one_token_per_step(model, gen, block, stop_at_eos, draft_steps, branch):
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=gen, block_length=block,
                          stop_at_eos=stop_at_eos)
    for prompt in PROMPTS:
        reference = generate(model, [prompt], config)
        ours = self_speculative_generate(model, prompt, config, draft_steps=draft_steps, branch=branch)
        assert ours.result.tokens.tolist() == reference.tokens.tolist()
        assert ours.steps == int(reference.nfe[0])            # the stepwise decoder's NFE
        assert ours.forwards <= ours.steps
        assert sum(ours.advanced) == ours.steps


def test_equals_threshold_decoding(model):
    config = DecodeConfig(scheduler=ThresholdScheduler(0.2), gen_length=12, block_length=6)
    for prompt in PROMPTS:
        reference = generate(model, [prompt], config)
        ours = self_speculative_generate(model, prompt, config, draft_steps=4, branch=2)
        assert ours.result.tokens.tolist() == reference.tokens.tolist()


def test_one_draft_step_is_the_stepwise_decoder(model):
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=8,
                          stop_at_eos=False)
    ours = self_speculative_generate(model, PROMPTS[0], config, draft_steps=1)
    assert ours.advanced == [1] * 8 and ours.forwards == 8 and ours.rows == 8


def test_a_stable_model_is_decoded_in_one_verification():
    """Predictions that never change with the context: every nested draft is right, so one
    forward for the prompt plus one for the drafts does the whole block (the last draft ends
    the decode and needs no forward of its own)."""
    target = torch.tensor([5, 6, 7, 8, 9, 10])
    confidence = torch.tensor([0.9, 0.5, 0.8, 0.6, 0.7, 0.95])
    oracle = OracleMaskPredictor(target, confidence, vocab_size=16, mask_token_id=15, eos_token_id=14)
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=6, block_length=6)
    ours = self_speculative_generate(oracle, [1, 2, 3], config, draft_steps=8)
    assert ours.result.tokens[0].tolist() == target.tolist()
    assert ours.steps == 6 and ours.forwards == 2 and ours.advanced == [6]


@pytest.mark.parametrize("family", ["fast_dllm", "sdar", "llada2"])
def test_block_diffusion_models_decode_on_their_grid(family):
    """A block-diffusion model: the canvas runs to the model's block grid, blocks lie on it, and
    Fast-dLLM v2's block start is committed alone in its block's first step, as in `generate`
    (prompts on and off the grid; block_length 2 is a sub-block of the model's 4)."""
    model = tiny_block_diffusion(family, seed=3, block_size=4)
    for block in (2, 4):
        config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=12, block_length=block)
        for prompt in ([3, 17, 5, 9], *PROMPTS[1:]):
            reference = generate(model, [prompt], config)
            ours = self_speculative_generate(model, prompt, config, draft_steps=4, branch=2)
            assert ours.result.tokens.tolist() == reference.tokens.tolist()
            assert ours.steps == int(reference.nfe[0])


@pytest.mark.parametrize("config,match", [
    (DecodeConfig(scheduler=LowConfidenceScheduler(), temperature=0.5, gen_length=8, block_length=8), "temperature"),
    (DecodeConfig(scheduler=LowConfidenceScheduler(), cache=PrefixCache(), gen_length=8, block_length=8), "cache"),
    (DecodeConfig(scheduler=RandomScheduler(), gen_length=8, block_length=8), "random"),
    (DecodeConfig(scheduler=CreditScheduler(), gen_length=8, block_length=8), "stateful"),
])
def test_refuses_what_it_cannot_replay(model, config, match):
    with pytest.raises(ValueError, match=match):
        self_speculative_generate(model, PROMPTS[0], config)


def test_bad_arguments(model):
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=8, block_length=8)
    with pytest.raises(ValueError, match="draft_steps"):
        self_speculative_generate(model, PROMPTS[0], config, draft_steps=0)
    with pytest.raises(ValueError, match="branch"):
        self_speculative_generate(model, PROMPTS[0], config, branch=0)
    with pytest.raises(ValueError, match="exceeds"):
        self_speculative_generate(model, list(range(1, 30)) * 20, config)


@pytest.mark.slow
def test_embedded_model_three_times_fewer_forwards():
    """The issue's target on the shipped dLLM (gen 32, one token per step): identical output and
    at least 3x fewer forwards with 8 draft steps and one leaf per step."""
    from dllm_decode.eval.tasks import TASKS
    from dllm_decode.models import load_model

    dllm = load_model("embedded")
    config = DecodeConfig(scheduler=LowConfidenceScheduler(), gen_length=32, block_length=32)
    steps = forwards = 0
    for example in [e for name in sorted(TASKS) for e in TASKS[name].examples("test", 1, 0)]:
        reference = generate(dllm, [example.prompt], config)
        ours = self_speculative_generate(dllm, example.prompt, config, draft_steps=8, branch=2)
        assert ours.result.tokens.tolist() == reference.tokens.tolist()
        steps += ours.steps
        forwards += ours.forwards
    assert steps >= 3 * forwards
