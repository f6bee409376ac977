"""The generic transformers masked-LM adapter (`HFMaskedLM`) on tiny offline models."""

from __future__ import annotations

import pytest
import torch

from dllm_decode.interfaces import DiffusionLM
from dllm_decode.models import HFMaskedLM, KVCache
from tests.models.conftest import LENGTH, VOCAB, left_padded_batch


def words(rows: int, length: int = LENGTH, seed: int = 0) -> torch.Tensor:
    """Ids of plain words (5..36): no [PAD]/[MASK], so RoBERTa's own positions count every one."""
    return torch.randint(5, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_tiny_mlm_is_a_diffusion_lm(tiny_mlm):
    assert isinstance(tiny_mlm, DiffusionLM) and not tiny_mlm.supports_kv
    assert (tiny_mlm.vocab_size, tiny_mlm.mask_token_id, tiny_mlm.eos_token_ids) == (VOCAB, 4, (3,))
    assert tiny_mlm.max_length == 64
    ids, mask = left_padded_batch((LENGTH, 8, 5))
    with torch.no_grad():
        out = tiny_mlm(ids, attention_mask=mask)
        assert out.shape == (3, LENGTH, VOCAB) and out.dtype == torch.float32
        torch.testing.assert_close(tiny_mlm(ids, attention_mask=mask, rows=(2, 7)), out[:, 2:7])
        torch.testing.assert_close(tiny_mlm(ids), tiny_mlm.model(input_ids=ids).logits)


def test_refuses_a_kv_cache(tiny_mlm):
    with pytest.raises(ValueError, match="no KV cache"):
        tiny_mlm(words(1), kv=KVCache(), rows=(0, 3))


def test_left_padding_is_invisible_for_bert(tiny_mlm):
    ids = words(2)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        padded = tiny_mlm(ids, attention_mask=mask)[1:, 4:]
        alone = tiny_mlm(ids[1:, 4:])
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)


def test_left_padding_is_invisible_for_roberta_positions():
    """RoBERTa numbers positions from padding_idx + 1: the adapter adds that offset."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=37, pad_token_id=1,
                           max_position_embeddings=66)
    model = HFMaskedLM(RobertaForMaskedLM(config), mask_token_id=4).eval()
    assert model.max_length == 64
    ids = words(2)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(ids, attention_mask=mask)[1:, 3:], model(ids[1:, 3:]),
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(ids, attention_mask=torch.ones_like(ids)), model(ids),
                                   atol=1e-5, rtol=1e-5)
