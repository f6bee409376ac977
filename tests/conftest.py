"""Shared pytest fixtures: tiny, seeded, offline models (no downloads)."""

from __future__ import annotations

import pytest
import torch

from dllm_decode._namespace import import_from_checkout

import_from_checkout()      # a checkout copied to a device machine runs its tests uninstalled

# One intra-op thread: the tiny test models gain nothing from more, and on a 2-core machine
# shared with other jobs extra threads only thrash.
torch.set_num_threads(1)


@pytest.fixture
def tiny_mlm():
    """Seeded ~18k-parameter bidirectional masked LM (BERT) behind the generic HF adapter.

    Vocab 37 laid out like a BERT word-piece vocab: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3 (EOS),
    [MASK] 4, words 5-36. `.model` is the raw `BertForMaskedLM`.
    """
    from transformers import BertConfig, BertForMaskedLM

    from dllm_decode.models.hf import HFMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=37, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64)
    return HFMaskedLM(BertForMaskedLM(config), mask_token_id=4, eos_token_ids=(3,)).eval()


@pytest.fixture(scope="session")
def embedded():
    """The shipped embedded dLLM (loaded once per session; tests must not change it)."""
    from dllm_decode.modelspec import ModelSpec, load_diffusion

    return load_diffusion(ModelSpec.parse("embedded"))
