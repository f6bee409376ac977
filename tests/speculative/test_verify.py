"""Verification rules on hand-written distributions: forced outcomes, then the exact law of the
first emitted token (chi-square), with negative controls that must fail the same test."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from dllm_decode.speculative.verify import greedy_verify, leading_run, speculative_verify

V = 6


def one_hot_logits(tokens: list[int], vocab: int = V) -> torch.Tensor:
    logits = torch.full((len(tokens), vocab), -10.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 10.0
    return logits


def test_leading_run():
    assert leading_run(torch.tensor([True, True, False, True])) == 2
    assert leading_run(torch.tensor([False, True])) == 0
    assert leading_run(torch.tensor([True, True])) == 2
    assert leading_run(torch.zeros(0, dtype=torch.bool)) == 0


@pytest.mark.parametrize("drafts,argmax,expected,n", [
    ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], 3),     # all accepted: bonus token
    ([1, 2, 3], [1, 5, 3, 4], [1, 5], 1),           # first mismatch: the target's token, stop
    ([1, 2, 3], [0, 2, 3, 4], [0], 0),              # nothing accepted: one target token
    ([], [4], [4], 0),                              # no draft: plain greedy step
])
def test_greedy_verify_forced(drafts, argmax, expected, n):
    new, accepted = greedy_verify(torch.tensor(drafts, dtype=torch.long), one_hot_logits(argmax))
    assert new.tolist() == expected and accepted == n


def test_greedy_verify_ties_take_the_first_index():
    logits = torch.zeros(2, V)                      # every token ties: argmax is token 0
    assert greedy_verify(torch.tensor([0]), logits)[0].tolist() == [0, 0]
    assert greedy_verify(torch.tensor([3]), logits)[0].tolist() == [0]


def test_speculative_verify_forced():
    """Near-one-hot p (HF test_speculative_sampling style): accept 2, reject the third, resample."""
    drafts = torch.tensor([1, 4, 5])
    p = one_hot_logits([1, 4, 2, 0]).softmax(-1)    # agrees on drafts 1, 4; wants 2 instead of 5
    q = one_hot_logits([1, 4, 5]).softmax(-1)
    new, n = speculative_verify(drafts, q, p, torch.Generator().manual_seed(0))
    assert n == 2 and new.tolist() == [1, 4, 2]
    new, n = speculative_verify(drafts[:2], q[:2], p[[0, 1, 3]], torch.Generator().manual_seed(0))
    assert n == 2 and new.tolist() == [1, 4, 0]     # all accepted: bonus from the last row


def first_token_counts(verify, p: torch.Tensor, q: torch.Tensor | None, draw_q: torch.Tensor,
                       n: int, seed: int = 0) -> tuple[torch.Tensor, float]:
    """Draft x ~ draw_q, verify one draft against p (then a bonus row); count the first emitted
    token. Returns the counts and the fraction of accepted drafts."""
    generator = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(draw_q, n, replacement=True, generator=generator)
    counts = torch.zeros(p.shape[0], dtype=torch.long)
    bonus = torch.full((p.shape[0],), 1.0 / p.shape[0])
    target = torch.stack([p, bonus])
    accepted = 0
    for x in drafts:
        new, k = verify(x.view(1), None if q is None else q.view(1, -1), target, generator)
        counts[new[0]] += 1
        accepted += k
    return counts, accepted / n


def chi_square_p(counts: torch.Tensor, p: torch.Tensor) -> float:
    """Pearson chi-square p-value of counts against p; zero-probability cells must stay empty."""
    support = p > 0
    assert counts[~support].sum() == 0, "a token with target probability 0 was emitted"
    expected = p[support].double() / p[support].double().sum() * counts.sum()
    assert (expected >= 5).all(), "too few samples for the chi-square approximation"
    return float(stats.chisquare(counts[support].double().numpy(), expected.numpy()).pvalue)


def dirichlet(seed: int, alpha: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch._standard_gamma(torch.full((V,), alpha), generator=generator)
    return x / x.sum()


def always_accept(drafts, q, p, generator):
    return torch.cat([drafts, p[-1].multinomial(1, generator=generator)]), drafts.shape[0]


def resample_from_p(drafts, q, p, generator):
    """The classic bug: on rejection sample from p instead of norm(max(0, p - q))."""
    q = torch.nn.functional.one_hot(drafts, p.shape[-1]).float() if q is None else q
    ratio = p[0, drafts[0]] / q[0, drafts[0]]
    if torch.rand(1, generator=generator) < ratio:
        return torch.cat([drafts, p[1:].multinomial(1, generator=generator).view(1)]), 1
    return p[0].multinomial(1, generator=generator), 0


N = 4000
P, Q = dirichlet(1), dirichlet(2)


@pytest.mark.parametrize("case", ["soft q", "one-hot q", "q equals p", "disjoint supports"])
def test_speculative_sampling_matches_the_target(case):
    p, q, draw = P, Q, Q
    if case == "one-hot q":                   # deterministic drafter: q = None, drafts fixed
        q, draw = None, torch.eye(V)[3]
    elif case == "q equals p":
        q = draw = P
    elif case == "disjoint supports":         # every draft rejected: output ~ p regardless
        p = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0, 0.0])
        q = draw = torch.tensor([0.0, 0.0, 0.0, 0.2, 0.3, 0.5])
    counts, rate = first_token_counts(speculative_verify, p, q, draw, N)
    assert chi_square_p(counts, p) > 1e-3
    beta = float(torch.minimum(p, draw).sum())           # acceptance rate = 1 - TV(p, q)
    assert stats.binomtest(round(rate * N), N, beta).pvalue > 1e-3 if 0 < beta < 1 else rate == beta


def test_zero_target_probability_is_never_emitted():
    p = torch.tensor([0.4, 0.0, 0.3, 0.0, 0.3, 0.0])
    counts, _ = first_token_counts(speculative_verify, p, Q, Q, 2000)
    assert counts[p == 0].sum() == 0


@pytest.mark.parametrize("wrong", [always_accept, resample_from_p])
def test_negative_controls_fail_the_same_test(wrong):
    """The chi-square test has power: known-wrong acceptance rules are rejected by it."""
    counts, _ = first_token_counts(wrong, P, Q, Q, N)
    assert chi_square_p(counts, P) < 1e-6


def test_raw_q_instead_of_warped_q_fails():
    """HF #47932: drafting from a warped q but reporting the raw one breaks exactness."""
    from dllm_decode.speculative.sampling import Sampling

    logits = Q.log()
    warped = Sampling(temperature=0.5, top_k=3).probs(logits)
    raw = logits.softmax(-1)
    good, _ = first_token_counts(speculative_verify, P, warped, warped, N)
    bad, _ = first_token_counts(speculative_verify, P, raw, warped, N)
    assert chi_square_p(good, P) > 1e-3
    assert chi_square_p(bad, P) < 1e-6


# -- several candidates at one node: recursive rejection sampling --

K = 3


def children(rule: str, q: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """K children of one node and the law each was drawn from (given its elder siblings)."""
    if rule == "A: deterministic top-k":
        return q.topk(K).indices, None                         # one-hot laws
    if rule == "B: i.i.d. from q":
        return torch.multinomial(q, K, replacement=True, generator=generator), q.expand(K, -1)
    if rule == "C: without replacement":
        left, tokens, laws = q.clone(), [], []
        for _ in range(K):
            law = left / left.sum()
            tokens.append(int(torch.multinomial(law, 1, generator=generator)))
            laws.append(law)
            left = left.clone()
            left[tokens[-1]] = 0.0
        return torch.tensor(tokens), torch.stack(laws)
    if rule == "bug: top-k verified with soft q":
        return q.topk(K).indices, q.expand(K, -1)
    raise ValueError(rule)


def tree_first_token_counts(rule: str, p: torch.Tensor, q: torch.Tensor, n: int, seed: int = 0):
    """One node with K children verified by `sample_tree`; counts of the first emitted token and
    the fraction of rounds in which some child was accepted."""
    from dllm_decode.speculative.verify import sample_tree

    generator = torch.Generator().manual_seed(seed)
    target = torch.cat([p.view(1, -1), torch.full((K, p.shape[0]), 1.0 / p.shape[0])])
    counts = torch.zeros(p.shape[0], dtype=torch.long)
    accepted = 0
    for _ in range(n):
        tokens, laws = children(rule, q, generator)
        path, new = sample_tree(tokens, (-1,) * K, laws, target, generator)
        counts[new[0]] += 1
        accepted += bool(path)
    return counts, accepted / n


@pytest.mark.parametrize("rule", ["A: deterministic top-k", "B: i.i.d. from q", "C: without replacement"])
def test_tree_node_rules_match_the_target(rule):
    counts, rate = tree_first_token_counts(rule, P, Q, N)
    assert chi_square_p(counts, P) > 1e-3
    single = float(torch.minimum(P, Q).sum())
    if rule != "A: deterministic top-k":
        assert rate > single                 # more candidates, more acceptance than one draft
    else:                                    # exactly the target's mass on the K children
        assert stats.binomtest(round(rate * N), N, float(P[Q.topk(K).indices].sum())).pvalue > 1e-3


def test_tree_node_bug_fails_the_same_test():
    """Negative control: deterministic top-k children verified with the q ratio (spec toy TV 0.22)."""
    counts, _ = tree_first_token_counts("bug: top-k verified with soft q", P, Q, N)
    assert chi_square_p(counts, P) < 1e-6
