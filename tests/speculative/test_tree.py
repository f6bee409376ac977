"""Token trees: layout, one tree forward equals the forwards of its paths, the accepted path's
cache equals a fresh prefill (both runtimes), forced verification outcomes, and greedy tree
speculation is token-identical to the target's greedy decoding."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.speculative import (CompactCausalLM, HeuristicScheduler, ModelDrafter, SpecConfig,
                                     speculative_generate)
from dllm_decode.speculative.drafters.base import Draft
from dllm_decode.speculative.kv import extend, keep_path, new_kv
from dllm_decode.speculative.loop import verify_round
from dllm_decode.speculative.sampling import Sampling
from dllm_decode.speculative.tree import TreeBuilder, TreeShape, path_to, spine, tree_attention
from dllm_decode.speculative.verify import greedy_tree
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from tests.speculative.conftest import perturbed, tiny_llama
from tests.speculative.test_greedy import NEW, PROMPT, hf_greedy
from tests.speculative.test_rollback import CONTEXT, assert_cache_equals_prefill, greedy_continuation

#        root
#       /    \
#      0      1
#     / \     |
#    2   3    4
PARENTS = (-1, -1, 0, 0, 1)


def test_tree_attention_layout():
    positions, mask = tree_attention(PARENTS, past=3, tail=2, device="cpu")
    assert positions.tolist() == [3, 4, 5, 5, 6, 6, 6]       # tail 3, 4; depth 0 at 5
    assert mask.shape == (7, 10)
    assert mask[:, :3].all()                                   # the cache is seen by every row
    assert mask[0, 3:].tolist() == [True] + [False] * 6        # tail is causal
    expected_nodes = [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 0, 1, 0],
                      [0, 1, 0, 0, 1]]
    assert mask[2:, 5:].int().tolist() == expected_nodes      # ancestors and self only
    assert mask[2:, 3:5].all()                                 # nodes see the whole tail


def test_layout_helpers():
    assert spine(PARENTS) == [0, 2]
    assert path_to(3, PARENTS) == [0, 3] and path_to(-1, PARENTS) == []


def test_builder_keeps_the_spine_then_the_best_nodes_with_their_elders():
    tree = TreeBuilder()
    a = tree.add(-1, 10, -0.1)           # spine
    b = tree.add(-1, 11, -1.0)
    c = tree.add(-1, 12, -1.5)
    d = tree.add(a, 20, -0.1)            # spine
    e = tree.add(a, 21, -0.3)
    f = tree.add(b, 30, -0.05)           # good value, but under b
    tree.add(d, 40, -5.0)                # spine, depth 2: beyond max_depth
    chosen = tree.select(budget=5, max_depth=2)
    assert chosen[:2] == [a, d]                                # the spine first
    assert set(chosen) == {a, d, e, b, f}                      # then by value; c needs b first
    order, parents = tree.layout(chosen)
    assert [tree.token[n] for n in order] == [10, 11, 20, 21, 30]
    assert parents == (-1, -1, 0, 0, 1)
    chain, none = tree.layout([a, d])
    assert none is None and chain == [a, d]                    # a chain is stored as None
    assert tree.select(budget=1, max_depth=5) == [a]


@pytest.mark.parametrize("runtime", ["hf", "compact"])
def test_tree_forward_equals_forwards_of_each_path(target, runtime):
    model = target if runtime == "hf" else CompactCausalLM(target)
    nodes = torch.tensor([7, 8, 9, 10, 11])
    kv = new_kv(model)
    extend(model, kv, CONTEXT[:-2], 1)                         # a cached prefix, a 2-token tail
    logits, kv = extend(model, kv, torch.cat([CONTEXT, nodes]), len(nodes) + 1, PARENTS)
    for node in range(len(PARENTS)):
        path = nodes[path_to(node, PARENTS)]
        fresh = new_kv(model)
        ref, _ = extend(model, fresh, torch.cat([CONTEXT, path]), 1)
        torch.testing.assert_close(logits[node + 1], ref[0], rtol=1e-4, atol=1e-4)
    ref_root, _ = extend(model, new_kv(model), CONTEXT, 1)
    torch.testing.assert_close(logits[0], ref_root[0], rtol=1e-4, atol=1e-4)


def branching_draft(model, wrong_first: bool) -> tuple[Draft, torch.Tensor]:
    """A tree whose greedy path leaves the spine: root -> [x, g0], g0 -> [y, g1], g1 -> [g2]."""
    greedy = greedy_continuation(model, CONTEXT, 4)
    vocab = 41
    tokens = torch.tensor([(greedy[0] + 1) % vocab, greedy[0], (greedy[1] + 1) % vocab, greedy[1],
                           greedy[2]])
    parents = (-1, -1, 1, 1, 3)
    if not wrong_first:
        tokens[0], tokens[1] = tokens[1].clone(), tokens[0].clone()
        parents = (-1, -1, 0, 0, 3)
    return Draft(tokens, torch.ones(5), parents=parents), greedy


@pytest.mark.parametrize("runtime", ["hf", "compact"])
def test_accepted_branch_cache_equals_prefill(target, runtime):
    """The accepted path is the second child at two depths: its rows are gathered into place."""
    model = target if runtime == "hf" else CompactCausalLM(target)
    draft, greedy = branching_draft(target, wrong_first=True)
    kv = new_kv(model)
    new, path, kv, logits = verify_round(model, kv, CONTEXT, draft, Sampling(), None)
    assert path == [1, 3, 4] and new.tolist() == greedy[:4].tolist()
    assert logits.shape == (4, 41)
    if runtime == "hf":
        assert_cache_equals_prefill(model, kv, torch.cat([CONTEXT, greedy[:3]]))
    else:
        assert kv.ids.tolist() == torch.cat([CONTEXT, greedy[:3]]).tolist()
        assert kv.cache.length == len(CONTEXT) + 3
    # The next round continues on the compacted cache exactly as on a fresh one.
    context = torch.cat([CONTEXT, new])
    after, _ = extend(model, kv, context, 1)
    fresh, _ = extend(model, new_kv(model), context, 1)
    torch.testing.assert_close(after, fresh, rtol=1e-4, atol=1e-4)


def test_keep_path_in_place_is_a_rollback(target):
    kv = new_kv(target)
    extend(target, kv, torch.cat([CONTEXT, torch.tensor([1, 2, 3])]), 1)
    keep_path(kv, len(CONTEXT), [0, 1])
    assert kv.ids.tolist() == CONTEXT.tolist() + [1, 2] and kv.cache.get_seq_length() == len(CONTEXT) + 2


def one_hot_logits(tokens: list[int], vocab: int = 6) -> torch.Tensor:
    logits = torch.full((len(tokens), vocab), -10.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 10.0
    return logits


@pytest.mark.parametrize("argmax,path,emitted", [
    ([1, 5, 5, 5, 5, 5], [1], [1, 5]),              # root wants 1: second child, then its row
    ([0, 3, 5, 5, 5, 5], [0, 3], [0, 3, 5]),        # spine, then the second grandchild, bonus
    ([4, 0, 0, 0, 0, 0], [], [4]),                  # no child matches: the target's token
    ([1, 2, 2, 2, 2, 2], [1, 4], [1, 2, 2]),        # down the second branch to its leaf
])
def test_greedy_tree_forced(argmax, path, emitted):
    tokens = torch.tensor([0, 1, 2, 3, 2])
    got_path, got = greedy_tree(tokens, PARENTS, one_hot_logits(argmax))
    assert got_path == path and got.tolist() == emitted


def test_lenient_check_keeps_a_likely_non_argmax_token():
    """BiLD rollback: a child that is not the argmax is kept if -log p(child) <= lenience."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-9, 1e-9, 1e-9],
                                     [1e-9, 1e-9, 1e-9, 0.98, 0.01, 0.01]]))
    drafts = torch.tensor([1])                      # p = 0.3: -log p = 1.20 nats
    assert greedy_tree(drafts, None, logits)[0] == []
    assert greedy_tree(drafts, None, logits, lenience=1.0)[0] == []
    path, new = greedy_tree(drafts, None, logits, lenience=1.3)
    assert path == [0] and new.tolist() == [1, 3]


@pytest.mark.parametrize("runtime", ["hf", "compact"])
@pytest.mark.parametrize("shape", [TreeShape(3, 12), pytest.param(TreeShape(2, 24), marks=pytest.mark.slow),
                                   pytest.param(TreeShape(4, 6), marks=pytest.mark.slow)])
def test_tree_drafts_are_exact(target, draft_model, runtime, shape):
    reference = hf_greedy(target)
    model = target if runtime == "hf" else CompactCausalLM(target)
    for draft in (perturbed(target, 0, 0.3), draft_model, target):
        for scheduler in (LowConfidenceScheduler(steps_per_block=1), HeuristicScheduler(),
                          ThresholdScheduler(0.3)):
            config = SpecConfig(scheduler, max_new_tokens=NEW, max_draft=5)
            result = speculative_generate(model, PROMPT, config, ModelDrafter(draft, shape))
            assert result.tokens.tolist() == reference
            assert all(n <= shape.budget for n in result.nodes)
            assert all(1 <= a <= d + 1 for a, d in zip(result.appended, result.drafted))


def test_tree_spine_is_the_chain_and_adds_acceptance(target):
    """The tree's spine is what the chain drafter proposes; its extra nodes only add matches."""
    drafter = perturbed(target, 0, 0.3)
    chain, _ = ModelDrafter(drafter).propose(CONTEXT, 5, Sampling(), None, (), new_kv(drafter))
    tree, _ = ModelDrafter(drafter, TreeShape(3, 12)).propose(CONTEXT, 5, Sampling(), None, (),
                                                              new_kv(drafter))
    assert tree.spine().tokens.tolist() == chain.tokens.tolist()
    assert len(tree) == 12 and tree.depth == 5 and tree.forwards == chain.forwards == 5
    config = SpecConfig(LowConfidenceScheduler(steps_per_block=1), max_new_tokens=NEW, max_draft=5)
    chained = speculative_generate(target, PROMPT, config, ModelDrafter(drafter))
    treed = speculative_generate(target, PROMPT, config, ModelDrafter(drafter, TreeShape(3, 24)))
    assert treed.mean_accepted > chained.mean_accepted


def test_tree_shape_validation():
    with pytest.raises(ValueError, match="branch"):
        TreeShape(branch=0)
    with pytest.raises(ValueError, match="budget"):
        TreeShape(budget=0)
