"""The model side of the block KV cache (`dllm_decode/models/layers.py`), LLaDA and Dream.

A cached forward must query only the given rows against the cached K/V, replace those rows' K/V
in place, rotate cached keys at their own positions and respect the padding mask, on left-padded
batches with odd lengths and a nonzero block offset (spec §6, "cache tests").
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from dllm_decode.models.layers import KVCache, apply_rope, default_positions, rope_tables
from dllm_decode.testing import assert_logits_close, logits_tolerance
from tests.models.conftest import LLADA_SIZES, left_padded_batch, make_llada

MASK = LLADA_SIZES["mask_token_id"]
LENGTH, START, END = 13, 6, 9          # odd canvas, block [6, 9), suffix [9, 13)
LENGTHS = (LENGTH, 8, 10)              # three rows, two of them left-padded


def canvas() -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = left_padded_batch(LENGTHS, seed=1, length=LENGTH)
    ids[:, START:] = MASK                                   # block and suffix still masked
    return ids, mask


def commit_some(ids: torch.Tensor) -> torch.Tensor:
    """Unmask two block columns, with different tokens in each row."""
    out = ids.clone()
    out[:, START] = torch.arange(ids.shape[0]) + 3
    out[:, START + 2] = torch.arange(ids.shape[0]) + 7
    return out


@pytest.mark.parametrize("rows", [(START, LENGTH), (START, END)], ids=["prefix", "dual"])
def test_one_layer_cached_step_equals_full_forward(make_native, rows):
    model = make_native(layers=1)
    ids, mask = canvas()
    kv = KVCache()
    refresh = model(ids, mask, kv=kv, rows=(START, LENGTH))
    assert_logits_close(refresh, model(ids, mask)[:, START:])
    changed = commit_some(ids)
    cached = model(changed, mask, kv=kv, rows=rows)
    assert cached.shape[1] == rows[1] - rows[0]
    assert_logits_close(cached, model(changed, mask)[:, rows[0]:rows[1]])


@pytest.mark.parametrize("rows", [(START, LENGTH), (START, END)], ids=["prefix", "dual"])
def test_multi_layer_cached_step_on_an_unchanged_canvas_equals_full_forward(make_native, rows):
    """Nothing changed since the refresh, so every cached K/V is current at every layer."""
    model = make_native(layers=3)
    ids, mask = canvas()
    kv = KVCache()
    model(ids, mask, kv=kv, rows=(START, LENGTH))
    cached = model(ids, mask, kv=kv, rows=rows)
    assert_logits_close(cached, model(ids, mask)[:, rows[0]:rows[1]])


def test_multi_layer_cached_step_is_stale_after_a_change(make_native):
    """With >= 2 layers, K/V outside the fed rows keep the refresh-time values (the approximation)."""
    model = make_native(layers=3)
    ids, mask = canvas()
    kv = KVCache()
    model(ids, mask, kv=kv, rows=(START, LENGTH))
    changed = commit_some(ids)
    cached = model(changed, mask, kv=kv, rows=(START, END))
    full = model(changed, mask)[:, START:END]
    assert (cached - full).abs().amax() > logits_tolerance(full)["atol"]     # beyond rounding


def test_cached_step_writes_the_fed_rows_in_place(make_native):
    model = make_native(layers=2)
    ids, mask = canvas()
    kv = KVCache()
    model(ids, mask, kv=kv, rows=(START, LENGTH))
    before = [k.clone() for k in kv.keys]
    storage = [k.data_ptr() for k in kv.keys]
    model(commit_some(ids), mask, kv=kv, rows=(START, END))
    fresh = KVCache()
    model(commit_some(ids), mask, kv=fresh, rows=(START, LENGTH))
    assert [k.data_ptr() for k in kv.keys] == storage                     # no copy of the cache
    assert_logits_close(kv.keys[0], fresh.keys[0])   # layer 0: the same keys, to rounding
    lookback = START - 1 if type(model).__name__ == "DreamModel" else START     # Dream feeds s - 1
    for layer, key in enumerate(kv.keys):
        torch.testing.assert_close(key[:, :, :lookback], before[layer][:, :, :lookback], atol=0, rtol=0)
        torch.testing.assert_close(key[:, :, END:], before[layer][:, :, END:], atol=0, rtol=0)


def test_padding_is_never_attended_through_the_cache(make_native):
    """Changing pad tokens changes nothing, refreshed or cached."""
    model = make_native(layers=1)
    ids, mask = canvas()
    other = torch.where(mask.bool(), ids, (ids + 5) % MASK)
    for tokens in (ids, other):
        kv = KVCache()
        model(tokens, mask, kv=kv, rows=(START, LENGTH))
        out = model(commit_some(tokens), mask, kv=kv, rows=(START, END))
        if tokens is ids:
            reference = out
    assert_logits_close(out, reference)


def test_rows_of_a_batch_are_independent_and_can_be_dropped(make_native):
    """Selecting cache rows after the refresh equals refreshing the smaller batch."""
    model = make_native(layers=2)
    ids, mask = canvas()
    kv = KVCache()
    model(ids, mask, kv=kv, rows=(START, LENGTH))
    keep = torch.tensor([0, 2])
    out = model(commit_some(ids)[keep], mask[keep], kv=kv.select_rows(keep), rows=(START, END))
    alone = KVCache()
    model(ids[keep], mask[keep], kv=alone, rows=(START, LENGTH))
    assert_logits_close(out, model(commit_some(ids)[keep], mask[keep], kv=alone, rows=(START, END)))


def stale_reference(model, before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor,
                    rows: tuple[int, int]) -> torch.Tensor:
    """Fast-dLLM's cached step written out for LLaDA: rows [a, b) of `after` are recomputed; at
    every layer the keys/values of all other columns are those of a full forward over `before`."""
    t, cfg = model.model.transformer, model.config
    cos, sin = rope_tables(default_positions(mask, *before.shape, before.device), cfg.head_dim, cfg.rope_theta)
    key_mask = mask.bool()[:, None, None, :]

    def heads(x):
        return rearrange(x, "b l (h d) -> b h l d", d=cfg.head_dim)

    def layer(block, h, lo, hi, stale):
        attn_norm, q, k, v, out, ff_norm, gate, up, down = block.parts()
        x = attn_norm(h)
        keys, values = apply_rope(heads(k(x)), cos[:, :, lo:hi], sin[:, :, lo:hi], True), heads(v(x))
        if stale is not None:
            keys = torch.cat([stale[0][:, :, :lo], keys, stale[0][:, :, hi:]], dim=2)
            values = torch.cat([stale[1][:, :, :lo], values, stale[1][:, :, hi:]], dim=2)
        queries = apply_rope(heads(q(x)), cos[:, :, lo:hi], sin[:, :, lo:hi], True)
        h = h + out(rearrange(F.scaled_dot_product_attention(queries, keys, values, attn_mask=key_mask),
                              "b h l d -> b l (h d)"))
        f = ff_norm(h)
        return h + down(F.silu(gate(f)) * up(f)), (keys, values)

    h, cached = t["wte"](before), []
    for block in t["blocks"]:
        h, kv = layer(block, h, 0, before.shape[1], None)
        cached.append(kv)
    a, b = rows
    h = t["wte"](after[:, a:b])
    for block, stale in zip(t["blocks"], cached):
        h, _ = layer(block, h, a, b, stale)
    return t["ff_out"](t["ln_f"](h))


@pytest.mark.parametrize("rows", [(START, LENGTH), (START, END)], ids=["prefix", "dual"])
def test_multi_layer_cached_step_uses_refresh_time_kv_of_the_other_columns(rows):
    """The approximation, exactly: stale K/V outside the fed rows, fresh inside, at every layer."""
    model = make_llada(layers=3, seed=2)
    ids, mask = canvas()
    kv = KVCache()
    model(ids, mask, kv=kv, rows=(START, LENGTH))
    changed = commit_some(ids)
    assert_logits_close(model(changed, mask, kv=kv, rows=rows),
                        stale_reference(model, ids, changed, mask, rows))
