"""Drafters in isolation: what they propose, with which confidence and at what cost."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.speculative import DiffusionDrafter, LookupDrafter, ModelDrafter, Sampling
from dllm_decode.speculative.drafters.layerskip import layer_subset, parse_layers
from dllm_decode.testing import OracleMaskPredictor
from dllm_decode.schedulers import ThresholdScheduler
from tests.speculative.conftest import MarkovLM


def propose(drafter, context, width, eos=(), sampling=Sampling()):
    draft, _ = drafter.propose(torch.tensor(context), width, sampling, None, eos, drafter.init_state())
    return draft


def test_dllm_drafter_reads_commit_confidences():
    """Threshold 0.9 over confidences [.95, .5, .99, .6]: steps commit {0, 2}, {3}, {1}."""
    target = torch.tensor([5, 6, 7, 8])
    oracle = OracleMaskPredictor(target, torch.tensor([0.95, 0.5, 0.99, 0.6]), vocab_size=12,
                                 mask_token_id=11, eos_token_id=10)
    draft = propose(DiffusionDrafter(oracle, ThresholdScheduler(0.9)), [1, 2, 3], 4)
    assert draft.tokens.tolist() == [5, 6, 7, 8] and draft.probs is None     # one-hot q
    torch.testing.assert_close(draft.confidence, torch.tensor([0.95, 0.5, 0.99, 0.6]))
    assert draft.forwards == 3
    eos_cut = propose(DiffusionDrafter(oracle, ThresholdScheduler(0.9)), [1, 2, 3], 4, eos=(6,))
    assert eos_cut.tokens.tolist() == [5, 6]                # nothing after a drafted end-of-text


def test_dllm_drafter_drops_tokens_and_respects_the_context_limit():
    seen = []

    class Recorder(OracleMaskPredictor):
        def forward(self, input_ids, *args, **kwargs):
            seen.append(input_ids[0].tolist())
            return super().forward(input_ids, *args, **kwargs)

    oracle = Recorder(torch.tensor([5, 6]), torch.tensor([0.99, 0.99]), 12, 11, 10)
    draft = propose(DiffusionDrafter(oracle, ThresholdScheduler(0.9), drop_ids=(4,)), [1, 4, 2], 2)
    assert seen[0] == [1, 2, 11, 11] and draft.tokens.tolist() == [5, 6]
    oracle.max_length = 3                                  # prompt of 2 + at most 1 position
    assert len(propose(DiffusionDrafter(oracle, ThresholdScheduler(0.9)), [1, 2], 2)) == 1
    oracle.max_length = 2                                  # no room: nothing drafted
    assert len(propose(DiffusionDrafter(oracle, ThresholdScheduler(0.9)), [1, 2], 2)) == 0


@pytest.mark.parametrize("context,width,expected", [
    ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),        # bigram "1 2" matched: continue after it
    ([1, 2, 3, 1, 2, 5, 2], 2, [3, 1]),        # bigram "5 2" absent; unigram "2": first match
    ([1, 2, 3], 4, []),                        # no earlier occurrence: nothing drafted
    ([7, 9, 8, 9], 5, [8, 9]),                 # continuation runs to the end of the context
])
def test_prompt_lookup(context, width, expected):
    draft = propose(LookupDrafter(), context, width)
    assert draft.tokens.tolist() == expected and draft.forwards == 0
    assert (draft.confidence == 1).all()


def test_lookup_cuts_at_eos_and_validates():
    assert propose(LookupDrafter(), [1, 2, 0, 4, 1], 4, eos=(0,)).tokens.tolist() == [2, 0]
    with pytest.raises(ValueError, match="max_ngram"):
        LookupDrafter(max_ngram=1, min_ngram=2)


def test_model_drafter_stops_at_end_of_text():
    # Bigram LM: 1 -> 2 -> 3 -> 0 (end of text) -> 1 ...; drafting past 0 would waste forwards.
    table = torch.full((5, 5), -10.0)
    for token, following in ((0, 1), (1, 2), (2, 3), (3, 0), (4, 1)):
        table[token, following] = 10.0
    draft = propose(ModelDrafter(MarkovLM(table)), [4, 1], 8, eos=(0,))
    assert draft.tokens.tolist() == [2, 3, 0]
    assert draft.forwards == 3
    assert propose(ModelDrafter(MarkovLM(table)), [4, 1], 8).tokens.tolist() == [2, 3, 0, 1, 2, 3, 0, 1]


def test_model_drafter_sampling_reports_its_warped_law(draft_model):
    sampling = Sampling(temperature=0.8, top_k=5)
    drafter = ModelDrafter(draft_model)
    draft, _ = drafter.propose(torch.tensor([3, 4, 5]), 4, sampling, torch.Generator().manual_seed(0),
                               (), drafter.init_state())
    assert draft.probs is not None and draft.probs.shape == (4, 41)
    assert ((draft.probs > 0).sum(-1) <= 5).all()           # top-k applied to q
    assert (draft.probs.gather(-1, draft.tokens.unsqueeze(-1)) > 0).all()


@pytest.mark.parametrize("spec,layers", [("2", (0, 1)), ("0,2", (0, 2)), (" 1 ", (0,))])
def test_parse_layers(spec, layers):
    assert parse_layers(spec, 3) == layers


@pytest.mark.parametrize("spec", ["3", "1,2", "0,5", "x", "0", ""])
def test_parse_layers_rejects(spec):
    with pytest.raises(ValueError, match="layer"):
        parse_layers(spec, 3)


def test_layer_subset_shares_weights_and_leaves_the_target_alone(target):
    shallow = layer_subset(target, (0, 2))
    assert len(shallow.model.layers) == 2 and len(target.model.layers) == 3
    assert shallow.model.layers[1] is target.model.layers[2]
    assert shallow.lm_head.weight is target.lm_head.weight
    ids = torch.tensor([[3, 4, 5]])
    assert not torch.allclose(shallow(ids).logits, target(ids).logits)
