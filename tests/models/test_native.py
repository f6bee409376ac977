"""Contract tests for the plain-torch LLaDA and Dream models (each test runs for both families)."""

from __future__ import annotations

import torch

from dllm_decode.interfaces import DiffusionLM
from dllm_decode.models import KVCache
from dllm_decode.testing import assert_logits_close
from tests.models.conftest import LENGTH, VOCAB, left_padded_batch



def logits(model, ids, mask=None, **kwargs):
    with torch.no_grad():
        return model(ids, attention_mask=mask, **kwargs)


def test_satisfies_protocol(make_native):
    model = make_native()
    assert isinstance(model, DiffusionLM) and model.supports_kv
    assert model.vocab_size == VOCAB and model.mask_token_id == 36 and model.eos_token_ids == (35,)
    assert model.max_length == 64
    ids, mask = left_padded_batch()
    out = logits(model, ids, mask)
    assert out.shape == (2, LENGTH, VOCAB) and out.dtype == torch.float32 and out.isfinite().all()


def test_rows_slice_the_full_forward(make_native):
    model = make_native()
    ids, mask = left_padded_batch()
    full = logits(model, ids, mask)
    for rows in [(0, LENGTH), (0, 1), (3, 8), (LENGTH - 1, LENGTH)]:
        assert_logits_close(logits(model, ids, mask, rows=rows), full[:, rows[0]:rows[1]])


def test_left_padding_is_invisible(make_native):
    """A left-padded row equals the same tokens unpadded, whatever sits in the pad columns."""
    model = make_native()
    ids, mask = left_padded_batch((LENGTH, 7))
    real = ids[1:, LENGTH - 7:]
    alone = logits(model, real)
    for pad_id in (0, 36):
        padded = ids.clone()
        padded[1, :LENGTH - 7] = pad_id
        assert_logits_close(logits(model, padded, mask)[1:, LENGTH - 7:], alone)


def test_batch_rows_are_independent(make_native):
    model = make_native()
    ids, mask = left_padded_batch((LENGTH, 5, 9))
    batched = logits(model, ids, mask)
    for row in range(3):
        one = logits(model, ids[row:row + 1], mask[row:row + 1])
        assert_logits_close(batched[row:row + 1], one)


def edit(ids: torch.Tensor, rows: tuple[int, int], seed: int) -> torch.Tensor:
    """New tokens inside canvas columns `rows` (a decode step committing or changing tokens)."""
    generator = torch.Generator().manual_seed(seed)
    changed = ids.clone()
    changed[:, rows[0]:rows[1]] = torch.randint(0, VOCAB, (ids.shape[0], rows[1] - rows[0]),
                                                generator=generator)
    return changed


# Blocks a decode walks through: dual-cache steps (the block), prefix-cache steps (block and
# suffix), a block starting at column 0 and one ending at the canvas end.
STEPS = [(3, 6), (3, 6), (6, 9), (6, LENGTH), (0, 4), (9, LENGTH), (1, 2)]


def test_one_layer_cache_is_exact(make_native):
    """One layer: cached K/V of other columns depend only on their own tokens, so every cached
    forward equals the uncached one (Dream's a > 0 rows recompute row a - 1 for the shift)."""
    model = make_native(layers=1)
    ids, mask = left_padded_batch((LENGTH, 8))
    kv = KVCache()
    assert_logits_close(logits(model, ids, mask, kv=kv), logits(model, ids, mask))
    for step, rows in enumerate(STEPS):
        ids = edit(ids, rows, seed=step)
        cached = logits(model, ids, mask, kv=kv, rows=rows)
        assert_logits_close(cached, logits(model, ids, mask)[:, rows[0]:rows[1]])
        assert cached.shape == (2, rows[1] - rows[0], VOCAB)


def test_refresh_forward_is_exact_with_two_layers(make_native):
    model = make_native(layers=2)
    ids, mask = left_padded_batch((LENGTH, 8))
    kv = KVCache()
    full = logits(model, ids, mask)
    assert_logits_close(logits(model, ids, mask, kv=kv, rows=(3, 6)), full[:, 3:6])
    assert len(kv.keys) == 2 and kv.keys[0].shape[-2] == LENGTH
    # With nothing changed since the refresh, a cached step is exact at any depth.
    assert_logits_close(logits(model, ids, mask, kv=kv, rows=(3, 6)), full[:, 3:6])


def test_two_layer_cache_goes_stale_after_edits(make_native):
    """Guard that the one-layer test is not vacuous: deeper cached K/V do go stale."""
    model = make_native(layers=2)
    ids, mask = left_padded_batch((LENGTH, 8))
    kv = KVCache()
    logits(model, ids, mask, kv=kv)
    ids = edit(ids, (3, 6), seed=0)
    cached = logits(model, ids, mask, kv=kv, rows=(3, 6))
    assert (cached - logits(model, ids, mask)[:, 3:6]).abs().amax() > 1e-4


def test_bfloat16_returns_float32_logits(make_native):
    model = make_native().to(torch.bfloat16)
    ids, mask = left_padded_batch()
    out = logits(model, ids, mask)
    assert out.dtype == torch.float32 and out.isfinite().all()
