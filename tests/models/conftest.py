"""Tiny seeded LLaDA / Dream / BERT models and on-disk checkpoints for the model tests.

Odd sizes (vocab 37, width 32, canvas 11) so a swapped dimension fails loudly. Norm weights and
biases are randomised too, so a swapped norm or a dropped bias changes the logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from dllm_decode.models import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM

VOCAB, LENGTH = 37, 11
LLADA_SIZES = dict(d_model=32, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=48,
                   vocab_size=VOCAB, max_sequence_length=64, rope_theta=5e5, rms_norm_eps=1e-5,
                   mask_token_id=36, eos_token_id=35, pad_token_id=35)
DREAM_SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=48, vocab_size=VOCAB,
                   max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-6,
                   mask_token_id=36, eos_token_id=35, pad_token_id=35)


def randomize_(model: nn.Module, seed: int) -> nn.Module:
    """Seeded weights: matrices N(0, 0.3^2), vectors (norms, biases) 1 + N(0, 0.2^2)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.3 if p.dim() > 1 else 1 + 0.2 * noise)
    return model.eval()


def make_llada(layers: int = 2, seed: int = 0, **overrides) -> LLaDAModelLM:
    config = LLaDAConfig(**{**LLADA_SIZES, "n_layers": layers, **overrides})
    return randomize_(LLaDAModelLM(config), seed)


def make_dream(layers: int = 2, seed: int = 0, **overrides) -> DreamModel:
    config = DreamConfig(**{**DREAM_SIZES, "num_hidden_layers": layers, **overrides})
    return randomize_(DreamModel(config), seed)


FAMILIES = {"llada": make_llada, "dream": make_dream}


@pytest.fixture(params=sorted(FAMILIES))
def make_native(request):
    """Factory `(layers=2, seed=0, **config overrides) -> model`, once per native family."""
    return FAMILIES[request.param]


def left_padded_batch(lengths: tuple[int, ...] = (LENGTH, 8), seed: int = 0,
                      length: int = LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) random ids (mask id included) and the 0/1 mask of rows left-padded to `lengths`."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (len(lengths), length), generator=generator)
    mask = torch.stack([torch.arange(length) >= length - n for n in lengths]).long()
    return ids, mask


def write_sharded(model: nn.Module, config: dict, directory: Path, shards: int = 2) -> None:
    """The HF sharded layout: `model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    names = sorted(model.state_dict())
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: model.state_dict()[k].contiguous() for k in names[i::shards]}
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": sum(v.numel() * 4 for v in model.state_dict().values())},
             "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]


def write_bert_dir(directory: Path, mask_token: str | None = "[MASK]", seed: int = 0) -> Path:
    """A seeded tiny `BertForMaskedLM` checkpoint plus a word-piece tokenizer built offline."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(BERT_VOCAB) + "\n")
    BertTokenizer(str(directory / "vocab.txt"), mask_token=mask_token).save_pretrained(directory)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(directory)
    return directory
