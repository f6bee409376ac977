"""`apd`: the acceptance rule, its degenerate mixtures, the causal guide and its counting."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_decode import DecodeConfig, generate
from dllm_decode.guide import load_guide
from dllm_decode.schedulers import APDScheduler
from dllm_decode.testing import tiny_llada, tiny_llada_with_tokenizer
from tests.schedulers.inputs import step_input

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


@pytest.fixture(scope="module")
def model():
    return tiny_llada(seed=5)


class Counting(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0
        for name in ("mask_token_id", "eos_token_ids", "vocab_size", "max_length", "supports_kv",
                     "ar_partner"):
            setattr(self, name, getattr(inner, name))

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)


def run(model, scheduler, prompts=PROMPTS, gen=16, block=8, **kw):
    config = DecodeConfig(scheduler, gen_length=gen, block_length=block, stop_at_eos=False, **kw)
    return generate(model, prompts, config, generator=torch.Generator().manual_seed(0), trace=True)


def random_view(seed: int, width: int = 8, vocab: int = 6):
    g = torch.Generator().manual_seed(seed)
    masked = torch.rand(2, width, generator=g) < 0.8
    masked[:, 0] = False                                   # committed columns before the frontier
    inp = step_input(torch.randn(2, width, vocab, generator=g) * 2, masked=masked)
    guide = torch.randn(2, width, vocab, generator=g).log_softmax(-1) * 2
    return dataclasses.replace(inp, guide_logits=guide)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), mixture=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
       lookahead=st.integers(0, 4))
def test_commits_a_contiguous_run_of_eligible_columns_from_the_frontier(seed, mixture, lookahead):
    inp = random_view(seed)
    commit = APDScheduler(mixture=mixture, lookahead=lookahead).select(inp, None)[0].commit
    for row in range(2):
        eligible = inp.eligible[row].nonzero().flatten().tolist()
        chosen = commit[row].nonzero().flatten().tolist()
        if not eligible:
            assert not chosen
            continue
        assert chosen == eligible[:len(chosen)] and chosen      # a prefix, the frontier included
        if lookahead:
            assert len(chosen) <= lookahead


def test_mixture_one_commits_the_whole_window_at_t0(model):
    inp = random_view(3)
    assert torch.equal(APDScheduler(mixture=1.0).select(inp, None)[0].commit, inp.eligible)
    result = run(model, APDScheduler(mixture=1.0))
    assert result.nfe.tolist() == [2, 2, 2]                # one step per block


def test_mixture_zero_commits_what_the_guide_would_say_given_the_draft_before_it():
    inp = random_view(5)
    commit = APDScheduler(mixture=0.0).select(inp, None)[0].commit
    guide_choice = inp.guide_logits.argmax(-1)
    for row in range(2):
        columns = commit[row].nonzero().flatten().tolist()
        for j in columns[1:]:                              # the frontier is always accepted
            assert int(inp.candidates[row, j]) == int(guide_choice[row, j])


def test_published_target_at_t_gt_0_shares_the_draft_noise(model):
    """At T > 0 with R = 1 the published target is the draft's own sample (every token
    accepted: one step per block); the code's greedy target is not."""
    published = run(model, APDScheduler(mixture=1.0), temperature=1.0)
    assert published.nfe.tolist() == [2, 2, 2]
    code = run(model, APDScheduler(mixture=1.0, published_target=False), temperature=1.0)
    assert (code.nfe > 2).any()
    for settings in (dict(mixture=0.5), dict(mixture=0.5, published_target=False)):
        a, b = (run(model, APDScheduler(**settings), temperature=1.0) for _ in range(2))
        assert torch.equal(a.tokens, b.tokens) and not (a.tokens == model.mask_token_id).any()


def test_published_and_code_targets_agree_at_t0(model):
    a = run(model, APDScheduler(mixture=0.4))
    b = run(model, APDScheduler(mixture=0.4, published_target=False))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.nfe, b.nfe)


def test_without_guide_logits_only_the_frontier_commits():
    inp = dataclasses.replace(random_view(7), guide_logits=None)
    commit = APDScheduler().select(inp, None)[0].commit
    assert (commit.sum(-1) == inp.eligible.any(-1).long()).all()


def test_guide_nfe_is_one_per_step_and_nfe_counts_only_the_dllm(model):
    counting = Counting(model)
    result = run(counting, APDScheduler(), prompts=[[1, 2, 3]])
    steps = len(result.trace)
    assert result.guide_nfe.tolist() == [steps] and result.nfe.tolist() == [steps]
    assert counting.calls == steps and torch.equal(result.forward_rows, result.nfe)


def test_batched_equals_one_by_one_with_frontiers_at_different_columns(model):
    batched = run(model, APDScheduler(mixture=0.3))
    for row, prompt in enumerate(PROMPTS):
        alone = run(model, APDScheduler(mixture=0.3), prompts=[prompt])
        assert torch.equal(batched.tokens[row], alone.tokens[0])
        assert batched.nfe[row] == alone.nfe[0] and batched.guide_nfe[row] == alone.guide_nfe[0]


def test_the_guide_reads_column_j_from_the_columns_before_it(model):
    guide = load_guide("auto", model)
    canvas = torch.tensor([[1, 2, 3, 36, 36], [35, 4, 5, 36, 36]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    draft = torch.tensor([[7, 8], [9, 10]])
    with torch.no_grad():
        got = guide.logits(canvas, mask, 3, draft)
        for row, ids in enumerate(([1, 2, 3, 7, 8], [4, 5, 9, 10])):
            want = guide.model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
            torch.testing.assert_close(got[row, :, :36], want[-3:-1, :36], rtol=1e-5, atol=1e-5)
    assert torch.isinf(got[..., model.mask_token_id]).all()         # [MASK] never in the mixture


def test_a_guide_with_another_vocabulary_is_refused_in_one_line():
    dllm = tiny_llada_with_tokenizer()
    with pytest.raises(ValueError, match="does not share the tokenizer") as err:
        generate(dllm, [[1, 2]], DecodeConfig(APDScheduler(verifier="ar_target"), gen_length=4,
                                              block_length=4))
    assert "\n" not in str(err.value)


def test_auto_without_a_known_partner_is_refused_before_any_work():
    dllm = tiny_llada()
    dllm.ar_partner = None
    with pytest.raises(ValueError, match="no same-tokenizer causal guide"):
        generate(dllm, [[1, 2]], DecodeConfig(APDScheduler(), gen_length=4, block_length=4))


def test_the_embedded_pair_decodes_and_counts(tmp_path):
    from dllm_decode.models.loading import load_model

    dllm = load_model("embedded")
    config = DecodeConfig(APDScheduler(), gen_length=32, block_length=32)
    result = generate(dllm, ["copy: 1 2 3"], config)
    assert result.text is not None and int(result.guide_nfe[0]) == int(result.nfe[0]) >= 1


@pytest.mark.parametrize("field, value", [("mixture", 1.5), ("mixture", -0.1), ("lookahead", -1),
                                          ("verifier", " ")])
def test_bad_settings_are_refused_in_one_line(field, value):
    with pytest.raises(ValueError, match=field):
        APDScheduler(**{field: value})


def test_the_noise_handed_over_is_the_noise_the_candidates_were_drawn_with(model):
    from dataclasses import dataclass
    from typing import ClassVar

    from dllm_decode.schedulers import LowConfidenceScheduler

    seen = []

    @dataclass(frozen=True)
    class Spy(LowConfidenceScheduler):
        needs_noise: ClassVar[bool] = True

        def select(self, inp, state):
            seen.append(inp)
            return super().select(inp, state)

    run(model, Spy(), temperature=1.0)
    assert seen and all(torch.equal(inp.candidates, (inp.logits.double() + inp.noise).argmax(-1))
                        for inp in seen)
    seen.clear()
    run(model, Spy())
    assert seen and all(inp.noise is None for inp in seen)


def test_the_guide_cache_of_the_committed_prefix_is_exact_and_feeds_only_the_rest(model):
    guide = load_guide("auto", model)
    fed = []
    hook = guide.model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]),
                                                 with_kwargs=True)
    try:
        canvas = torch.tensor([[35, 1, 2, 3, 4, 5, 6, 7, 8, 36], [1, 2, 3, 9, 9, 5, 4, 7, 8, 36]])
        mask = torch.tensor([[0] + [1] * 9, [1] * 10])
        memory: dict = {}
        with torch.no_grad():
            for offset in (4, 4, 6, 8):                      # the window moves on, never back
                draft = canvas[:, offset:offset + 2]
                cached = guide.logits(canvas, mask, offset, draft, memory)
                fresh = guide.logits(canvas, mask, offset, draft)
                finite = torch.isfinite(fresh)
                assert torch.equal(finite, torch.isfinite(cached))
                torch.testing.assert_close(cached[finite], fresh[finite], rtol=1e-5, atol=1e-5)
            # a changed canvas width drops the cache: everything is fed again
            wider = torch.cat([torch.full((2, 1), 35), canvas], 1)
            guide.logits(wider, torch.cat([torch.zeros(2, 1, dtype=torch.long), mask], 1), 9,
                         wider[:, 9:11], memory)
    finally:
        hook.remove()
    # cached calls fed 6, then 3 (offset unchanged: columns 3.. again), 5, 5; fresh calls the whole
    assert fed[:-1:2] == [6, 3, 5, 5] and fed[1::2] == [6, 6, 8, 10] and fed[-1] == 11
