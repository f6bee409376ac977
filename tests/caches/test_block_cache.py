"""Block-diffusion models through the one loop: the position-grid blocks, sub-block decoding and
the exact block cache (cached == uncached on every step; batched == one by one)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dllm_decode import DecodeConfig, Decoding, generate
from dllm_decode.caches import BlockCache, DualCache
from dllm_decode.config import accepts_cache
from dllm_decode.interfaces import NoCache
from dllm_decode.schedulers import MASK_SCHEDULERS, SCHEDULERS, LowConfidenceScheduler, ThresholdScheduler
from dllm_decode.testing import assert_probabilities_close, tiny_block_diffusion, tiny_llada

FAMILIES = ["fast_dllm", "sdar", "llada2"]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


def config(scheduler=None, gen=16, block=4, cache=None, **kw):
    return DecodeConfig(scheduler=scheduler or ThresholdScheduler(0.2), cache=cache or NoCache(),
                        gen_length=gen, block_length=block, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_steps_see_the_uncached_probabilities(family):
    """Step by step, every eligible column's confidence under the cache equals the uncached one
    (up to float rounding of differently shaped products) and the commits are the same."""
    model = tiny_block_diffusion(family, seed=3)
    plain, cached = (generate(model, PROMPTS, config(cache=c, stop_at_eos=False), trace=True)
                     for c in (NoCache(), BlockCache()))
    assert len(plain.trace) == len(cached.trace)
    for a, b in zip(plain.trace, cached.trace):
        lo = max(a["offset"], b["offset"])                    # windows differ; compare the overlap
        hi = min(a["offset"] + a["commit"].shape[1], b["offset"] + b["commit"].shape[1])
        cut = lambda s, key: s[key][:, lo - s["offset"]:hi - s["offset"]]  # noqa: E731
        finite = torch.isfinite(cut(a, "confidence"))
        assert int(finite.sum()) == int(torch.isfinite(a["confidence"]).sum())   # eligible inside both
        assert torch.equal(finite, torch.isfinite(cut(b, "confidence")))
        assert_probabilities_close(cut(b, "confidence")[finite], cut(a, "confidence")[finite])
        assert torch.equal(cut(a, "commit"), cut(b, "commit")) and int(a["commit"].sum()) == int(b["commit"].sum())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block", [4, 2])             # the model's block, and sub-blocks of it
def test_block_cache_decodes_exactly_like_no_cache_and_batched_like_alone(family, block):
    model = tiny_block_diffusion(family, seed=5)
    plain = generate(model, PROMPTS, config(block=block))
    cached = generate(model, PROMPTS, config(block=block, cache=BlockCache()))
    assert torch.equal(plain.tokens, cached.tokens) and torch.equal(plain.nfe, cached.nfe)
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], config(block=block, cache=BlockCache()))
        assert torch.equal(alone.tokens[0], cached.tokens[row]) and alone.nfe[0] == cached.nfe[row]


def test_blocks_follow_the_position_grid():
    """A 3-token prompt on a 4-grid: the first decode block is the one position that completes
    the prompt's block, then whole blocks, the last one running on to the grid past P + G
    (one token per step shows the block sizes; the answer keeps G = 12 tokens)."""
    model = tiny_block_diffusion("sdar", seed=1)
    result = generate(model, [[1, 2, 3]], config(LowConfidenceScheduler(), gen=12, block=4,
                                                 stop_at_eos=False, cache=BlockCache()), trace=True)
    per_block: list[int] = []
    for step in result.trace:
        if step["block_step"] == 0:
            per_block.append(0)
        per_block[-1] += int(step["commit"].sum())
    assert per_block == [1, 4, 4, 4] and result.nfe.tolist() == [13] and result.tokens.shape == (1, 12)
    eligible_first = torch.isfinite(result.trace[0]["confidence"][0]).sum()
    assert int(eligible_first) == 1


def test_the_block_cache_refuses_bidirectional_models_and_misaligned_blocks():
    with pytest.raises(ValueError, match="needs a block-causal model"):
        generate(tiny_llada(), [[1, 2]], config(cache=BlockCache(), block=4))
    with pytest.raises(ValueError, match="block_length must divide 4"):
        generate(tiny_block_diffusion("sdar"), [[1, 2]], config(gen=24, block=8))


def test_requests_join_a_block_diffusion_batch():
    model = tiny_block_diffusion("fast_dllm", seed=2)
    cfg = config(cache=BlockCache())
    decoding = Decoding(model, cfg.cache)
    decoding.add([[1, 2, 3]], cfg, key="a")
    decoding.step()
    while decoding.block_step:
        decoding.step()
    decoding.add([[4, 5, 6, 7, 8]], dataclasses.replace(cfg, gen_length=8), key="b")
    out = {}
    while not decoding.finished:
        for key in decoding.step():
            out[key] = decoding.result(key)
    assert torch.equal(out["a"].tokens, generate(model, [[1, 2, 3]], cfg).tokens)
    assert torch.equal(out["b"].tokens, generate(model, [[4, 5, 6, 7, 8]],
                                                 dataclasses.replace(cfg, gen_length=8)).tokens)


def test_other_caches_run_on_block_diffusion_models():
    model = tiny_block_diffusion("sdar", seed=4)
    result = generate(model, PROMPTS, config(cache=DualCache()))
    assert not (result.tokens == model.mask_token_id).any()


@pytest.mark.parametrize("name", sorted(MASK_SCHEDULERS))
def test_every_scheduler_decodes_a_block_diffusion_model_with_its_cache(name):
    """Each registered rule runs on the block grid (the oracle after its reference); the exact
    cache changes nothing; a rule that chooses its own block bounds is refused in one line, and
    one that takes back finished blocks runs without the cache only."""
    model = tiny_block_diffusion("fast_dllm", seed=6)
    scheduler = SCHEDULERS[name]()
    if scheduler.chooses_block_bounds:
        with pytest.raises(ValueError, match="cannot choose block bounds"):
            generate(model, PROMPTS, config(scheduler))
        return
    if name == "oracle":
        reference = generate(model, PROMPTS, config(LowConfidenceScheduler())).tokens
        scheduler = SCHEDULERS[name].from_reference(reference)
    seeded = dict(generator=torch.Generator().manual_seed(0))
    plain = generate(model, PROMPTS, config(scheduler), **seeded)
    if not accepts_cache(scheduler, "block"):         # e.g. takes back finished blocks: no cache
        assert not (plain.tokens == model.mask_token_id).any()
        with pytest.raises(ValueError, match="use cache 'none'"):
            config(scheduler, cache=BlockCache())
        return
    cached = generate(model, PROMPTS, config(scheduler, cache=BlockCache()),
                      generator=torch.Generator().manual_seed(0))
    assert not (plain.tokens == model.mask_token_id).any()
    assert torch.equal(plain.tokens, cached.tokens) and torch.equal(plain.nfe, cached.nfe)


def test_the_first_forward_stops_at_the_active_blocks():
    """Under block-causal attention nothing before the block end sees later columns, so the block
    cache's first forward feeds the canvas only up to the active model blocks (a gen-64 canvas
    costs the first forward no more than a gen-8 one), with the same tokens as no cache."""
    model = tiny_block_diffusion("fast_dllm", seed=7)
    widths = []
    forward = model.forward

    def spy(input_ids, *args, **kwargs):
        widths.append(input_ids.shape[1])
        return forward(input_ids, *args, **kwargs)

    model.forward = spy
    cached = generate(model, [[1, 2, 3, 4]], config(gen=64, cache=BlockCache(), stop_at_eos=False))
    assert widths[0] == 8                       # prompt block + the first 4-position decode block
    model.forward = forward
    plain = generate(model, [[1, 2, 3, 4]], config(gen=64, stop_at_eos=False))
    assert torch.equal(cached.tokens, plain.tokens) and torch.equal(cached.nfe, plain.nfe)
