"""The uniform-noise canvas inside the one loop (`Decoding`): the committed prefix grows by whole
canvases, NFE counts encoder and decoder passes, a request cancelled mid-canvas leaves the
others' tokens unchanged, and a row whose text ended keeps drawing with its siblings."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.config import DecodeConfig
from dllm_decode.interfaces import NoCache
from dllm_decode.registry import component
from dllm_decode.sampler import Decoding, generate
from dllm_decode.testing import tiny_diffusion_gemma

CANVAS = 8


@pytest.fixture(scope="module")
def model():
    return tiny_diffusion_gemma(seed=1, steps=4)


def config(**options) -> DecodeConfig:
    return DecodeConfig(component("scheduler", {"name": "uniform_noise", "steps": 4, **options}),
                        gen_length=3 * CANVAS, block_length=CANVAS)


def test_the_committed_prefix_grows_by_whole_canvases(model):
    decoding = Decoding(model, NoCache())
    key = decoding.add([[5, 6, 7], [9]], config(), generator=torch.Generator().manual_seed(0))
    seen = set()
    while not decoding.finished:
        decoding.step()
        if key not in decoding.results:
            tokens, final = decoding.snapshot(key)
            assert bool((tokens[tokens == decoding.mask_id] == -1).all())
            seen.update(final.tolist())
    assert seen == {0, CANVAS, 2 * CANVAS}           # nothing is final inside a canvas
    result = decoding.result(key)
    expected = generate(model, [[5, 6, 7], [9]], config(), generator=torch.Generator().manual_seed(0))
    assert torch.equal(result.tokens, expected.tokens)


def test_nfe_is_encoder_plus_decoder_passes(model):
    one_step = config(stability_threshold=0, confidence_threshold=100.0)   # every canvas: 1 step
    result = generate(model, [[5, 6, 7]], one_step)
    assert result.nfe.tolist() == [3 * (1 + 1)]
    full = generate(model, [[5, 6, 7]], config(confidence_threshold=1e-9))  # never confident
    assert full.nfe.tolist() == [3 * (1 + 4)]


def test_a_request_cancelled_mid_canvas_leaves_the_others_unchanged(model):
    alone = generate(model, [[4, 4, 2]], config(), generator=torch.Generator().manual_seed(5))
    decoding = Decoding(model, NoCache())
    gone = decoding.add([[1, 2, 3, 4, 5]], config(), generator=torch.Generator().manual_seed(1))
    kept = decoding.add([[4, 4, 2]], config(), generator=torch.Generator().manual_seed(5))
    decoding.step()
    decoding.cancel(gone)
    while not decoding.finished:
        decoding.step()
    assert torch.equal(decoding.result(kept).tokens, alone.tokens)


def test_a_row_whose_text_ended_keeps_drawing_with_its_sibling(model):
    """As the reference runs a batch: a row whose text ended is pad from then on but keeps
    stepping (and drawing) with its sibling, so the sibling's tokens are those of the run
    without an end of text, up to its own; once every row ended, the rest is pad."""
    prompts = [[5, 6, 7], [9, 8]]
    plain = generate(model, prompts, config(), generator=torch.Generator().manual_seed(2))
    eos = int(plain.tokens[0, 1])                      # a token row 0's first canvas produces
    model.eos_token_ids, model.generation_defaults = (eos,), {"max_denoising_steps": 4, "pad_token_id": 0}
    try:
        ended = generate(model, prompts, config(), generator=torch.Generator().manual_seed(2))
    finally:
        model.eos_token_ids, model.generation_defaults = (), {"max_denoising_steps": 4}
    first, second = ended.tokens.tolist()
    stop = first.index(eos)
    assert stop < CANVAS and first[stop + 1:] == [0] * (3 * CANVAS - stop - 1)
    own = second.index(eos) if eos in second else len(second)
    assert second[:own] == plain.tokens[1, :own].tolist()
    assert own == len(second) or second[own + 1:] == [0] * (len(second) - own - 1)
