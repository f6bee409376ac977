"""Staged speculation (a draft sped up by a second-stage drafter), lookup tries, the `staged:`
name form, and BiLD's fallback and rollback policies."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.registry import component
from dllm_decode.speculative import (BildScheduler, DraftContext, LookupDrafter, ModelDrafter,
                                     Sampling, SpecConfig, StagedDrafter, TreeShape, make_drafter,
                                     speculative_generate)
from dllm_decode.speculative.kv import new_kv
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from tests.speculative.conftest import perturbed
from tests.speculative.test_greedy import NEW, PROMPT, hf_greedy

REPEATING = torch.tensor(PROMPT + PROMPT)


def test_staged_chain_is_the_draft_models_own_chain_in_fewer_forwards(target):
    """Exact inner verification: the draft proposes what it would alone, cheaper."""
    draft = perturbed(target, 0, 0.3)
    alone, _ = ModelDrafter(draft).propose(REPEATING, 8, Sampling(), None, (), new_kv(draft))
    staged = StagedDrafter(ModelDrafter(draft), LookupDrafter())
    sped, _ = staged.propose(REPEATING, 8, Sampling(), None, (), staged.init_state())
    assert sped.tokens.tolist() == alone.tokens.tolist()
    torch.testing.assert_close(sped.view, alone.view, rtol=1e-4, atol=1e-4)
    assert sped.forwards < alone.forwards


@pytest.mark.parametrize("spec", ["staged:layerskip:2>lookup", "staged:layerskip:0,2>layerskip:1",
                                  "staged:layerskip:2>layerskip:1>lookup"])
@pytest.mark.parametrize("tree", [None, TreeShape(3, 12)])
def test_staged_drafters_are_exact(target, spec, tree):
    reference = hf_greedy(target)
    drafter, _ = make_drafter(spec, DraftContext(target, None, "auto", tree=tree))
    assert isinstance(drafter, StagedDrafter)
    for scheduler in (LowConfidenceScheduler(steps_per_block=1), ThresholdScheduler(0.3)):
        result = speculative_generate(target, PROMPT, SpecConfig(scheduler, max_new_tokens=NEW, max_draft=6),
                                      drafter)
        assert result.tokens.tolist() == reference
        if tree is not None:
            assert max(result.nodes) <= tree.budget


@pytest.mark.parametrize("spec,match", [
    ("staged:lookup>layerskip:1", "first stage"),
    ("staged:layerskip:2", "FIRST>SECOND"),
    ("staged:layerskip:2>none", "cannot be `none`"),
    ("staged:layerskip:2>", "FIRST>SECOND"),
])
def test_staged_name_errors(target, spec, match):
    with pytest.raises(ValueError, match=match):
        make_drafter(spec, DraftContext(target))


def test_lookup_trie_merges_every_match():
    context = torch.tensor([1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2, 3, 7, 9, 1, 2])
    chain, _ = LookupDrafter().propose(context, 4, Sampling(), None, (9,), None)
    assert chain.tokens.tolist() == [3, 4, 9] and chain.parents is None
    trie, _ = LookupDrafter(tree=TreeShape(3, 10)).propose(context, 4, Sampling(), None, (9,), None)
    # the leftmost continuation is the spine; "3" was seen twice, then 4 or 7; "5 6" once
    assert trie.spine().tokens.tolist() == [3, 4, 9]
    assert trie.tokens.tolist() == [3, 5, 4, 7, 6, 9, 9, 9]
    assert trie.parents == (-1, -1, 0, 0, 1, 2, 3, 4)
    small, _ = LookupDrafter(tree=TreeShape(3, 4)).propose(context, 4, Sampling(), None, (9,), None)
    assert len(small) == 4 and small.spine().tokens.tolist() == [3, 4, 9]


def test_lookup_trie_is_exact(target):
    reference = hf_greedy(target)
    config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=NEW, max_draft=5)
    result = speculative_generate(target, PROMPT, config, LookupDrafter(tree=TreeShape(3, 12)))
    assert result.tokens.tolist() == reference


def test_bild_without_rollback_is_exact_and_falls_back_early(target):
    """alpha_rb = None: exact verification with BiLD's stop rule; the fallback threshold stops
    drafting at the first unsure token (and drafts at most N tokens)."""
    reference = hf_greedy(target)
    draft = ModelDrafter(perturbed(target, 0, 0.3))
    eager = speculative_generate(target, PROMPT, SpecConfig(BildScheduler(0.0, None, 4), max_new_tokens=NEW),
                                 draft)
    careful = speculative_generate(target, PROMPT, SpecConfig(BildScheduler(0.9, None, 4),
                                                              max_new_tokens=NEW), draft)
    assert eager.tokens.tolist() == careful.tokens.tolist() == reference
    assert max(eager.drafted) <= 4 and max(careful.drafted) <= 4
    assert careful.draft_forwards < eager.draft_forwards and sum(careful.drafted) < sum(eager.drafted)


def test_bild_rollback_is_a_quality_knob(target):
    """A lenient check accepts more; at 0 nats it is exact; a huge threshold accepts every draft."""
    reference = hf_greedy(target)
    draft = ModelDrafter(perturbed(target, 0, 0.3))

    def run(rollback):
        return speculative_generate(target, PROMPT, SpecConfig(BildScheduler(0.0, rollback, 6),
                                                               max_new_tokens=NEW), draft)

    exact, lenient, everything = run(0.0), run(3.0), run(100.0)
    assert exact.tokens.tolist() == reference
    assert lenient.mean_accepted >= exact.mean_accepted
    assert everything.matched == everything.drafted                   # every draft accepted
    assert everything.tokens.tolist() != reference


def test_bild_validation_and_registry():
    rule = component("draft_length", {"name": "bild", "fallback": "0.5", "rollback": "none"})
    assert rule == BildScheduler(0.5, None, 10)
    for bad in ({"fallback": 1.5}, {"rollback": -1.0}, {"max_small": 0}):
        with pytest.raises(ValueError):
            BildScheduler(**bad)
    with pytest.raises(ValueError, match="greedy only"):
        SpecConfig(BildScheduler(), sampling=Sampling(1.0))
    SpecConfig(BildScheduler(rollback=None), sampling=Sampling(1.0))     # exact: sampling is fine
