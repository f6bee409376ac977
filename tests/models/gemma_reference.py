"""A tiny DiffusionGemma checkpoint written by transformers' own `save_pretrained`, with every
weight and `layer_scalar` randomised (so a dropped norm, scale or scalar changes the logits),
and the reference model that wrote it. Odd-free sizes are the reference's constraints: two
layers (sliding, full) with different head dims and kv-head counts, window 8, canvas 8."""

from __future__ import annotations

from pathlib import Path

import torch

TEXT = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, head_dim=16, global_head_dim=32,
            num_global_key_value_heads=1, sliding_window=8, num_experts=4, top_k_experts=2,
            moe_intermediate_size=16, layer_types=["sliding_attention", "full_attention"])
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, head_dim=16, position_embedding_size=64)
CANVAS = 8


def reference_model(seed: int = 0):
    """The seeded transformers `DiffusionGemmaForBlockDiffusion` (float32, eval)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    config = DiffusionGemmaConfig(text_config=TEXT, vision_config=VISION, canvas_length=CANVAS)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(noise * 0.3 if p.dim() > 1 else 1 + 0.2 * noise)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))
    return model


def write_reference(directory: Path, seed: int = 0):
    """Save the seeded reference model to `directory`; returns the reference as a user loads it
    (`from_pretrained`, which also picks its attention and experts kernels: a model built from a
    config rounds differently, ~1e-6, enough to flip a sampled token)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    reference_model(seed).save_pretrained(str(directory))
    return DiffusionGemmaForBlockDiffusion.from_pretrained(str(directory)).eval()
