"""Tiny causal LMs for the speculative tests: seeded random Llamas and a lookup-table Markov LM."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

VOCAB = 41          # odd, so a swapped dimension fails loudly


def tiny_llama(seed: int, layers: int = 3, vocab: int = VOCAB, eos: int | None = None):
    """A seeded random `LlamaForCausalLM` (width 32), eval mode, float32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                         max_position_embeddings=256, eos_token_id=eos, bos_token_id=None,
                         pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():                     # sharper logits than the 0.02 init: fewer near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    return model


def perturbed(model, seed: int, scale: float):
    """A copy of `model` with Gaussian noise on every matrix: a partially correct draft."""
    import copy

    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=generator) * scale * p.std())
    return other


class MarkovLM(nn.Module):
    """Next-token logits depend only on the current token: `table[token]` (a bigram model).

    Speaks the transformers causal-LM call (`input_ids`, `past_key_values`, `logits_to_keep`) so
    the real loop drives it; it needs no cache, and its exact conditionals are the table rows,
    which the distribution tests compare against.
    """

    def __init__(self, table: Tensor):
        super().__init__()
        self.register_buffer("table", table.float())
        self.vocab_size = table.shape[0]

    def forward(self, input_ids: Tensor, past_key_values=None, use_cache: bool = True,
                logits_to_keep: int = 0, **_) -> SimpleNamespace:
        logits = self.table[input_ids]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(1, layers=2)
