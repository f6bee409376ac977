"""The whole loop samples sequences from the target's law (Leviathan et al. 2023, Theorem 1).

Target and draft are bigram tables over V = 3; 3 tokens per sample pass through the accept,
reject-and-resample and bonus paths; the empirical joint over the 27 sequences is compared with
the exact product of the target's (warped) conditionals. A wrong acceptance rule patched into
the loop must fail the same test.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scipy import stats

from dllm_decode.speculative import loop as loop_module
from dllm_decode.speculative import (HeuristicScheduler, LookupDrafter, ModelDrafter, Sampling,
                                     SpecConfig, speculative_generate)
from dllm_decode.schedulers import LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.speculative.drafters import model as model_drafter
from dllm_decode.speculative.tree import TreeShape
from tests.speculative.conftest import MarkovLM

V, LENGTH, N = 3, 3, 2000
TARGET = torch.tensor([[2.0, 0.5, 0.0], [0.0, 1.5, 0.3], [1.0, 0.0, 0.8]])
DRAFT = torch.tensor([[0.0, 1.0, 0.2], [1.2, 0.0, 0.0], [0.0, 0.5, 1.5]])


def exact_joint(sampling: Sampling, first: int) -> torch.Tensor:
    """(V**LENGTH,) exact probability of each continuation of `first` under the warped target."""
    step = sampling.probs(TARGET).double()                 # (V, V) warped conditionals
    step = step / step.sum(-1, keepdim=True)
    joint = step[first]
    for _ in range(LENGTH - 1):
        last = torch.arange(joint.shape[0]) % V            # index = t1 * V^2 + t2 * V + t3
        joint = (joint.unsqueeze(-1) * step[last]).reshape(-1)
    return joint


def empirical(drafter, sampling: Sampling, scheduler, max_draft: int, seed: int = 0) -> torch.Tensor:
    config = SpecConfig(scheduler=scheduler, max_new_tokens=LENGTH, max_draft=max_draft,
                        sampling=sampling, stop_at_eos=False)
    target = MarkovLM(TARGET)
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V ** LENGTH, dtype=torch.long)
    for _ in range(N):
        tokens = speculative_generate(target, [0, 1, 0], config, drafter, generator=generator,
                                      eos_ids=()).tokens
        counts[int((tokens * V ** torch.arange(LENGTH - 1, -1, -1)).sum())] += 1
    return counts


def joint_p_value(counts: torch.Tensor, joint: torch.Tensor) -> float:
    support = joint > 0
    assert counts[~support].sum() == 0, "a sequence of target probability 0 was sampled"
    # Merge cells whose expected count is under 5 into one (chi-square validity).
    expected = joint[support] / joint[support].sum() * counts.sum()
    observed = counts[support].double()
    small = expected < 5
    if small.any():
        expected = torch.cat([expected[~small], expected[small].sum().view(1)])
        observed = torch.cat([observed[~small], observed[small].sum().view(1)])
    return float(stats.chisquare(observed.numpy(), expected.numpy()).pvalue)


CASES = {
    "draft model, gamma 2": (lambda: ModelDrafter(MarkovLM(DRAFT)), Sampling(1.0),
                             LowConfidenceScheduler(steps_per_block=1), 2),
    "draft model, warped, heuristic": (lambda: ModelDrafter(MarkovLM(DRAFT)),
                                       Sampling(0.7, top_k=2), HeuristicScheduler(initial=1), 4),
    "prompt lookup (one-hot q)": (lambda: LookupDrafter(), Sampling(1.0, top_p=0.9),
                                  LowConfidenceScheduler(steps_per_block=1), 2),
    # A sampled spine plus deterministic siblings (one-hot laws), verified by recursive
    # rejection sampling over the tree.
    "tree, branch 3": (lambda: ModelDrafter(MarkovLM(DRAFT), TreeShape(3, 8)), Sampling(1.0),
                       LowConfidenceScheduler(steps_per_block=1), 2),
    # A cut that depends on a sampled token's own confidence: the loop verifies the token that
    # stopped the run (dropping it, as the loop once did, fails this test: p ~ 2e-5).
    "threshold cut": (lambda: ModelDrafter(MarkovLM(DRAFT)), Sampling(1.0), ThresholdScheduler(0.5), 2),
}


@pytest.mark.parametrize("case", [
    "draft model, gamma 2",
    "tree, branch 3",
    pytest.param("threshold cut", marks=pytest.mark.slow),
    # The single-step tests cover warping and one-hot q fast; through the whole loop: slow.
    pytest.param("draft model, warped, heuristic", marks=pytest.mark.slow),
    pytest.param("prompt lookup (one-hot q)", marks=pytest.mark.slow),
])
def test_loop_samples_the_target_joint(case):
    make, sampling, scheduler, gamma = CASES[case]
    counts = empirical(make(), sampling, scheduler, gamma)
    assert joint_p_value(counts, exact_joint(sampling, first=0)) > 1e-3


def test_wrong_rule_fails_the_same_test(monkeypatch):
    """Negative control: always accepting drafts (bonus from the last row) must be detected."""
    def always_accept(drafts, parents, q, p, generator):
        return list(range(drafts.shape[0])), torch.cat([drafts, p[-1].multinomial(1, generator=generator)])

    monkeypatch.setattr(loop_module, "sample_tree", always_accept)
    make, sampling, scheduler, gamma = CASES["draft model, gamma 2"]
    counts = empirical(make(), sampling, scheduler, gamma)
    assert joint_p_value(counts, exact_joint(sampling, first=0)) < 1e-6


@pytest.mark.slow
def test_soft_q_on_deterministic_tree_siblings_fails(monkeypatch):
    """Negative control for trees: report the draft's soft q as the law of the deterministic
    siblings (the spec's biased 'q-ratio on top-k' rule); the same test must fail."""
    original = model_drafter._Growth.draft

    def soft_laws(self, nodes, parents):
        draft = original(self, nodes, parents)
        return dataclasses.replace(draft, probs=draft.view)

    monkeypatch.setattr(model_drafter._Growth, "draft", soft_laws)
    make, sampling, scheduler, gamma = CASES["tree, branch 3"]
    counts = empirical(make(), sampling, scheduler, gamma)
    assert joint_p_value(counts, exact_joint(sampling, first=0)) < 1e-6
