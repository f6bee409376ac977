"""The one attention call (`models.layers.sdpa`): repeating K/V heads for a masked grouped-query
call (what CUDA runs, so SDPA keeps a fused kernel) equals SDPA's own `enable_gqa`."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.models.layers import sdpa
from dllm_decode.testing import assert_logits_close


@pytest.mark.parametrize("mask_kind", ["none", "keys", "per_query"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_expanded_kv_heads_equal_enable_gqa(mask_kind, heads, kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, 5, 8, generator=g)
    k, v = (torch.randn(2, kv_heads, 9, 8, generator=g) for _ in range(2))
    mask = {"none": None,
            "keys": torch.tensor([[True] * 9, [False] * 3 + [True] * 6])[:, None, None, :],
            "per_query": torch.rand(2, 1, 5, 9, generator=g) > 0.3}[mask_kind]
    if mask is not None:
        mask[..., -1] = True                                   # every query attends somewhere
    grouped = sdpa(q, k, v, mask, expand_kv=False)
    expanded = sdpa(q, k, v, mask, expand_kv=True)
    assert grouped.shape == expanded.shape == (2, heads, 5, 8)
    assert_logits_close(expanded, grouped)


def test_cpu_default_keeps_enable_gqa():
    """On the CPU the default does not copy K/V (the same kernel runs either way)."""
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    mask = torch.ones(1, 1, 1, 3, dtype=torch.bool)
    assert torch.equal(sdpa(q, k, v, mask), sdpa(q, k, v, mask, expand_kv=False))   # same call, same path
