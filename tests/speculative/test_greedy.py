"""Greedy speculative decoding returns the target's own greedy tokens, for every drafter and
draft-length scheduler (fp32, CPU, tiny random Llamas)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.speculative import (CompactCausalLM, DiffusionDrafter, HeuristicScheduler, LookupDrafter,
                                     ModelDrafter, Sampling, SpecConfig, layerskip_drafter,
                                     speculative_generate)
from dllm_decode.testing import tiny_llada
from dllm_decode.schedulers import FactorScheduler, LowConfidenceScheduler, ThresholdScheduler
from tests.speculative.conftest import VOCAB, perturbed, tiny_llama

PROMPT = [3, 17, 5, 9, 3, 17, 5, 22, 9, 3]
NEW = 24


def hf_greedy(model, prompt=PROMPT, new=NEW) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def drafters(target, draft_model):
    return {
        "same model (all accepted)": ModelDrafter(target),
        "random model (mostly rejected)": ModelDrafter(draft_model),
        "perturbed target (partial)": ModelDrafter(perturbed(target, 0, 0.3)),
        "prompt lookup": LookupDrafter(),
        "layer skip, early exit": layerskip_drafter(target, "1"),
        "layer skip, Draft & Verify subset": layerskip_drafter(target, "0,2"),
        "layer skip, compact runtime": layerskip_drafter(target, "0,2", "compact"),
        "perturbed target, compact runtime": ModelDrafter(CompactCausalLM(perturbed(target, 0, 0.3))),
        "dLLM block": DiffusionDrafter(tiny_llada(0, vocab_size=VOCAB + 1), ThresholdScheduler(0.5)),
    }


SCHEDULERS = {
    "threshold": ThresholdScheduler(0.3),
    "constant": LowConfidenceScheduler(steps_per_block=1),
    "heuristic": HeuristicScheduler(),
    "factor": FactorScheduler(),
}


def test_plain_loop_equals_hf_generate(target):
    result = speculative_generate(target, PROMPT, SpecConfig(ThresholdScheduler(), max_new_tokens=NEW))
    assert result.tokens.tolist() == hf_greedy(target)
    assert result.target_forwards == NEW and result.mean_accepted == 1.0


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_every_drafter_is_exact(target, draft_model, scheduler):
    reference = hf_greedy(target)
    for name, drafter in drafters(target, draft_model).items():
        for max_draft in (1, 5):
            config = SpecConfig(SCHEDULERS[scheduler], max_new_tokens=NEW, max_draft=max_draft)
            result = speculative_generate(target, PROMPT, config, drafter)
            assert result.tokens.tolist() == reference, (name, max_draft)
            assert sum(result.appended) == NEW
            assert all(1 <= a <= d + 1 for a, d in zip(result.appended, result.drafted))


def test_acceptance_extremes(target, draft_model):
    """The target drafting for itself is always accepted; the outcome counts say so."""
    config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=NEW, max_draft=5)
    same = speculative_generate(target, PROMPT, config, ModelDrafter(target))
    assert same.matched == same.drafted and same.acceptance_rate == 1.0
    assert same.target_forwards == -(-NEW // 6)           # 5 drafts + 1 bonus per round
    partial = speculative_generate(target, PROMPT, config, ModelDrafter(perturbed(target, 0, 0.3)))
    assert 0 < sum(partial.matched) < sum(partial.drafted)


def test_budget_and_eos_inside_a_draft(target):
    """The budget is met exactly; decoding stops right after an end-of-text the target emits."""
    reference = hf_greedy(target)
    eos = reference[7]
    first = reference.index(eos)
    config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=NEW, max_draft=6)
    result = speculative_generate(target, PROMPT, config, ModelDrafter(target), eos_ids=(eos,))
    assert result.tokens.tolist() == reference[:first + 1]
    for budget in (1, 2, 7):
        config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=budget, max_draft=6)
        assert speculative_generate(target, PROMPT, config, ModelDrafter(target)).tokens.tolist() == reference[:budget]


def test_sampling_is_seeded(target, draft_model):
    config = SpecConfig(HeuristicScheduler(), max_new_tokens=NEW, sampling=Sampling(1.0, top_p=0.9))
    runs = [speculative_generate(target, PROMPT, config, ModelDrafter(draft_model),
                                 generator=torch.Generator().manual_seed(seed)).tokens.tolist()
            for seed in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_early_stop_changes_no_draft_length(target, draft_model):
    """Stopping a draft as soon as the scheduler cuts saves draft forwards, nothing else."""
    for scheduler in (ThresholdScheduler(0.5), LowConfidenceScheduler(steps_per_block=2), FactorScheduler()):
        results = [speculative_generate(
            target, PROMPT, SpecConfig(scheduler, max_new_tokens=NEW, early_stop=stop),
            ModelDrafter(perturbed(target, 0, 0.3))) for stop in (False, True)]
        assert results[0].drafted == results[1].drafted
        assert results[0].tokens.tolist() == results[1].tokens.tolist()
        assert results[1].draft_forwards <= results[0].draft_forwards
        if isinstance(scheduler, ThresholdScheduler):           # it does cut drafts short here
            assert results[1].draft_forwards < results[0].draft_forwards


def test_context_is_enforced(target):
    """Prompt + budget past the target's 256 positions is refused up front (naming both counts),
    in both runtimes; exactly the context is allowed."""
    spare = 256 - len(PROMPT)
    for model in (target, CompactCausalLM(target)):
        config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=spare + 1)
        with pytest.raises(ValueError, match=rf"prompt \({len(PROMPT)} tokens\) \+ max_new_tokens \({spare + 1}\).*256"):
            speculative_generate(model, PROMPT, config, LookupDrafter())
    config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=spare)
    assert len(speculative_generate(target, PROMPT, config, LookupDrafter()).tokens) <= spare
