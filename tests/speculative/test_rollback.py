"""After a partial acceptance the target's KV cache equals a fresh prefill of the accepted prefix,
and a draft model's cache follows whatever the target accepted."""

from __future__ import annotations

import torch

from dllm_decode.speculative import Draft, ModelDrafter, Sampling
from dllm_decode.speculative.kv import extend, new_kv
from dllm_decode.speculative.loop import verify_round

CONTEXT = torch.tensor([3, 17, 5, 9, 3, 17, 5, 22, 9, 3])


def greedy_continuation(model, context: torch.Tensor, n: int) -> torch.Tensor:
    out = model.generate(context.unsqueeze(0), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, context.shape[0]:]


def assert_cache_equals_prefill(model, kv, tokens: torch.Tensor) -> None:
    fresh = new_kv(model)
    extend(model, fresh, tokens, 1)
    assert kv.ids.tolist() == tokens.tolist()
    assert kv.cache.get_seq_length() == tokens.shape[0]
    for ours, ref in zip(kv.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(ours.keys, ref.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.values, ref.values, rtol=1e-5, atol=1e-5)


def test_target_cache_after_partial_acceptance(target):
    """Round 1 prefills and verifies 4 drafts whose third is wrong: 2 accepted, cache = context + 2."""
    greedy = greedy_continuation(target, CONTEXT, 5)
    drafts = greedy[:4].clone()
    drafts[2] = (drafts[2] + 1) % target.config.vocab_size
    draft = Draft(drafts, torch.ones(4))
    kv = new_kv(target)
    new, path, kv, _ = verify_round(target, kv, CONTEXT, draft, Sampling(), None)
    n = len(path)
    assert n == 2 and new.tolist() == greedy[:3].tolist()
    assert_cache_equals_prefill(target, kv, torch.cat([CONTEXT, greedy[:2]]))
    # Next round: the appended correction is fed with new drafts, on top of the rolled-back cache.
    context = torch.cat([CONTEXT, new])
    new2, path2, kv, _ = verify_round(target, kv, context, Draft(greedy[3:5], torch.ones(2)), Sampling(), None)
    n2 = len(path2)
    assert n2 == 2 and new2.tolist()[:2] == greedy[3:5].tolist()
    assert_cache_equals_prefill(target, kv, torch.cat([context, greedy[3:5]]))


def test_full_acceptance_keeps_every_draft(target):
    greedy = greedy_continuation(target, CONTEXT, 4)
    new, path, kv, _ = verify_round(target, new_kv(target), CONTEXT, Draft(greedy[:3], torch.ones(3)),
                                    Sampling(), None)
    n = len(path)
    assert n == 3 and new.tolist() == greedy[:4].tolist()            # bonus token appended
    assert_cache_equals_prefill(target, kv, torch.cat([CONTEXT, greedy[:3]]))


def test_draft_cache_follows_the_accepted_context(target, draft_model):
    drafter = ModelDrafter(draft_model)
    state = drafter.init_state()
    draft, state = drafter.propose(CONTEXT, 5, Sampling(), None, (), state)
    assert len(draft) == 5 and draft.forwards == 5
    # The target accepted two drafts and appended its own token: the drafter's next call must
    # drop the other drafts from its cache before continuing.
    accepted = torch.cat([CONTEXT, draft.tokens[:2], (draft.tokens[2:3] + 1) % 41])
    again, state = drafter.propose(accepted, 3, Sampling(), None, (), state)
    fresh, _ = drafter.propose(accepted, 3, Sampling(), None, (), drafter.init_state())
    assert again.tokens.tolist() == fresh.tokens.tolist()
    assert_cache_equals_prefill(draft_model, state, torch.cat([accepted, again.tokens[:-1]]))
