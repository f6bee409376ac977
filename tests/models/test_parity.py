"""Parity against independent references from transformers (float32, CPU).

LLaDA is Llama with renamed weights and no causal mask; Dream is Qwen2 without the causal mask,
with its logits shifted right by one. The references run eager attention with an explicit 4-D
additive mask (0 = attend) that allows every real key, and positions `cumsum(mask) - 1`.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dllm_decode.models import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM
from dllm_decode.models.layers import default_positions
from dllm_decode.testing import assert_logits_close
from tests.models.conftest import (DREAM_SIZES, LENGTH, LLADA_SIZES, VOCAB, left_padded_batch,
                                   randomize_)


LLAMA_TO_LLADA = {  # Llama-style suffix -> LLaDA suffix (the released LLaDA names)
    "input_layernorm": "attn_norm", "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj",
    "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
    "post_attention_layernorm": "ff_norm", "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj",
    "mlp.down_proj": "ff_out",
}


def llada_name(llama_name: str) -> str:
    if llama_name == "model.embed_tokens.weight":
        return "model.transformer.wte.weight"
    if llama_name == "model.norm.weight":
        return "model.transformer.ln_f.weight"
    if llama_name == "lm_head.weight":
        return "model.transformer.ff_out.weight"
    _, _, layer, *rest = llama_name.split(".")        # model.layers.{i}.<module>.weight
    module, param = ".".join(rest[:-1]), rest[-1]
    return f"model.transformer.blocks.{layer}.{LLAMA_TO_LLADA[module]}.{param}"


def additive_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, L) 0/1 -> (B, 1, L, L) float: every query may attend every real key, no causality."""
    batch, length = attention_mask.shape
    allowed = attention_mask.bool()[:, None, None, :].expand(batch, 1, length, length)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def reference_logits(reference, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    positions = default_positions(mask, *ids.shape, ids.device)
    with torch.no_grad():
        mask4 = additive_mask(mask, reference.dtype)
        return reference(ids, attention_mask=mask4, position_ids=positions).logits


def assert_bidirectional(reference, ids: torch.Tensor, mask: torch.Tensor) -> None:
    """Guard: the reference really is non-causal (row 0 sees the last token)."""
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    diff = reference_logits(reference, ids, mask)[:, 0] - reference_logits(reference, changed, mask)[:, 0]
    assert diff.abs().amax() > 1e-4


def tiny_llama(n_kv_heads: int, seed: int) -> LlamaForCausalLM:
    cfg = LLaDAConfig(**{**LLADA_SIZES, "n_kv_heads": n_kv_heads})
    config = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                         intermediate_size=cfg.mlp_hidden_size, num_hidden_layers=cfg.n_layers,
                         num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
                         rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=64,
                         rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                         attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
    config._attn_implementation = "eager"
    return randomize_(LlamaForCausalLM(config), seed)


def tiny_qwen2(tied: bool, seed: int) -> Qwen2ForCausalLM:
    cfg = DreamConfig(**DREAM_SIZES)
    config = Qwen2Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size,
                         num_hidden_layers=cfg.num_hidden_layers,
                         num_attention_heads=cfg.num_attention_heads,
                         num_key_value_heads=cfg.kv_heads, rms_norm_eps=cfg.rms_norm_eps,
                         max_position_embeddings=64, tie_word_embeddings=tied,
                         rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
    config._attn_implementation = "eager"
    return randomize_(Qwen2ForCausalLM(config), seed)


BATCHES = {"unpadded": (LENGTH, LENGTH), "left_padded": (LENGTH, 6)}


@pytest.mark.parametrize("padding", sorted(BATCHES))
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_llada_matches_bidirectional_llama(n_kv_heads, padding):
    reference = tiny_llama(n_kv_heads, seed=1)
    model = LLaDAModelLM(LLaDAConfig(**{**LLADA_SIZES, "n_kv_heads": n_kv_heads}))
    model.load_state_dict({llada_name(k): v for k, v in reference.state_dict().items()}, strict=True)
    ids, mask = left_padded_batch(BATCHES[padding], seed=2)
    assert_bidirectional(reference, ids, mask)

    expected = reference_logits(reference, ids, mask)
    with torch.no_grad():
        got = model(ids, attention_mask=mask)
    real = mask.bool()                                    # pad rows are garbage in both
    assert_logits_close(got[real], expected[real])


def shift_like_dream(raw: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Reference shift: row i gets raw row i - 1; a sequence start (position 0) keeps its own."""
    shifted = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
    return torch.where((positions == 0).unsqueeze(-1), raw, shifted)


@pytest.mark.parametrize("padding", sorted(BATCHES))
@pytest.mark.parametrize("tied", [False, True])
def test_dream_matches_bidirectional_qwen2_shifted(tied, padding):
    reference = tiny_qwen2(tied, seed=3)
    model = DreamModel(DreamConfig(**{**DREAM_SIZES, "tie_word_embeddings": tied}))
    state = reference.state_dict()
    if tied:
        state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=True)         # Dream's names are Qwen2's names
    ids, mask = left_padded_batch(BATCHES[padding], seed=4)
    assert_bidirectional(reference, ids, mask)

    positions = default_positions(mask, *ids.shape, ids.device)
    expected = shift_like_dream(reference_logits(reference, ids, mask), positions)
    with torch.no_grad():
        got = model(ids, attention_mask=mask)
    real = mask.bool()
    assert_logits_close(got[real], expected[real])
    if padding == "unpadded":                          # the released rule, to the letter
        raw = reference_logits(reference, ids, mask)
        assert_logits_close(got[:, 0], raw[:, 0])
        assert_logits_close(got[:, 1:], raw[:, :-1])


def test_dream_rotates_in_model_dtype_like_qwen2():
    """bf16: Dream rounds cos/sin and rotates in bf16 as Qwen2 does; compare loosely (kernels differ)."""
    reference = tiny_qwen2(tied=False, seed=5).to(torch.bfloat16)
    model = DreamModel(DreamConfig(**DREAM_SIZES))
    model.load_state_dict(reference.state_dict(), strict=True)
    model = model.to(torch.bfloat16)
    ids, mask = left_padded_batch((LENGTH, LENGTH), seed=6)
    raw = reference_logits(reference, ids, mask).float()
    with torch.no_grad():
        got = model(ids, attention_mask=mask)
    expected = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
    assert (got - expected).abs().amax() < 0.1 * expected.abs().amax()
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9
