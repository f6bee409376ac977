"""LLaDA's Monte-Carlo ELBO (`dllm_decode.likelihood`) against exact values."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dllm_decode.likelihood import loglikelihood
from dllm_decode.testing import tiny_llada

PREFIX, TARGET = [5, 6, 7], [8, 9, 10, 11]


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=3)


def masked_logits(model, prefix, target, masked, cond=True):
    x = torch.tensor([prefix + target])
    x[0, len(prefix):][torch.tensor(masked)] = model.mask_token_id
    if not cond:
        x[0, :len(prefix)] = model.mask_token_id
    return model(x)[0, len(prefix):].double()


def test_a_single_token_target_is_scored_exactly(model):
    logits = masked_logits(model, PREFIX, [8], [True])
    exact = logits.log_softmax(-1)[0, 8].item()
    assert loglikelihood(model, PREFIX, [8]) == pytest.approx(exact, abs=1e-5)
    assert loglikelihood(model, PREFIX, [8], mc_num=64, mc_batch=8) == pytest.approx(exact, abs=1e-5)


def test_guidance_follows_the_formula(model):
    cfg = 1.5
    c, u = masked_logits(model, PREFIX, [8], [True]), masked_logits(model, PREFIX, [8], [True], cond=False)
    exact = (u + (cfg + 1) * (c - u)).log_softmax(-1)[0, 8].item()
    assert loglikelihood(model, PREFIX, [8], cfg=cfg) == pytest.approx(exact, abs=1e-4)
    assert exact != pytest.approx(loglikelihood(model, PREFIX, [8]), abs=1e-3)


def brute_force_terms(model, prefix, target):
    """Every (mask count m, mask set S) with its probability and its term (L/m) sum CE_S."""
    length = len(target)
    terms = []
    for m in range(1, length + 1):
        subsets = list(itertools.combinations(range(length), m))
        for subset in subsets:
            masked = [i in subset for i in range(length)]
            logp = masked_logits(model, prefix, target, masked).log_softmax(-1)
            ce = -sum(logp[i, target[i]].item() for i in subset)
            terms.append((1 / length / len(subsets), length / m * ce))
    return terms


def test_the_estimate_converges_to_the_exact_elbo(model):
    terms = brute_force_terms(model, PREFIX, TARGET)
    mean = sum(p * t for p, t in terms)
    std = math.sqrt(sum(p * (t - mean) ** 2 for p, t in terms))
    mc_num = 2048
    estimate = loglikelihood(model, PREFIX, TARGET, mc_num=mc_num, mc_batch=64)
    assert abs(estimate - (-mean)) < 4 * std / math.sqrt(mc_num)
    few = [loglikelihood(model, PREFIX, TARGET, mc_num=8, mc_batch=8, seed=s) for s in range(3)]
    assert len(set(few)) == 3                # the seed changes the draws


def test_scores_repeat_whatever_was_scored_before(model):
    first = loglikelihood(model, PREFIX, TARGET, mc_num=16, mc_batch=8)
    loglikelihood(model, [1, 2], [3, 4, 5], mc_num=16, mc_batch=8)
    assert loglikelihood(model, PREFIX, TARGET, mc_num=16, mc_batch=8) == first


def test_an_empty_prefix_scores_the_whole_sequence(model):
    assert math.isfinite(loglikelihood(model, [], TARGET, mc_num=8, mc_batch=8))


@pytest.mark.parametrize("kwargs, fragment", [
    ({"target": []}, "target (continuation) is empty"),
    ({"mc_num": 10, "mc_batch": 4}, "multiple of mc_batch"),
    ({"mc_batch": 0}, "multiple of mc_batch"),
    ({"cfg": -1.0}, "cfg must be >= 0"),
    ({"prefix": [1] * 510}, "exceed the model's context of 512"),
])
def test_bad_arguments(model, kwargs, fragment):
    args = {"prefix": PREFIX, "target": TARGET, **kwargs}
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        loglikelihood(model, args.pop("prefix"), args.pop("target"), **args)
