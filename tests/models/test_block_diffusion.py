"""Block-diffusion models (Fast-dLLM v2, SDAR, LLaDA2): parity, block-causal mask, token shift,
MoE routing by hand, padding invariance, the exact finished-block KV cache, config validation.

Parity references are transformers' Qwen2 / Llama / Qwen3 run with the same weights, eager
attention and an explicit 4-D additive block-causal mask built here by brute force. The
checkpoints are written the way the releases ship them: the reference's own `save_pretrained`
(its config keys, its parameter names) plus the family's keys (`bd_size`, `block_size`,
`mask_token_id`, `model_type`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from dllm_decode.interfaces import DiffusionLM
from dllm_decode.models import (FastDLLMModel, KVCache, LLaDA2Config, ModelLoadError,
                                SDARModel, load_model)
from dllm_decode.models.layers import apply_rope, default_positions, rope_tables
from dllm_decode.models.llada2 import LLaDA2MoE, LLaDA2Router, group_limited_topk
from dllm_decode.testing import (BLOCK_DIFFUSION_FAMILIES, assert_decodes_agree, assert_logits_close,
                                 tiny_block_diffusion)
from tests.models.conftest import randomize_

VOCAB, MASK, EOS, BLOCK, LENGTH = 37, 36, 35, 4, 13


def logits(model, ids, mask=None, **kwargs):
    with torch.no_grad():
        return model(ids, attention_mask=mask, **kwargs)


def batch(lengths: tuple[int, ...] = (LENGTH, 8), seed: int = 0, length: int = LENGTH):
    """(B, L) random non-special ids and the 0/1 mask of rows left-padded to `lengths`."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, EOS, (len(lengths), length), generator=generator)
    mask = torch.stack([torch.arange(length) >= length - n for n in lengths]).long()
    return ids, mask


# ---- parity with transformers under an explicit block-causal mask ---------------------------

def brute_force_block_mask(mask: torch.Tensor, block: int) -> torch.Tensor:
    """(B, 1, L, L) additive float mask: 0 where key k may be attended by query q, i.e.
    floor(pos_k / b) <= floor(pos_q / b) and k is real; written as plain loops on purpose."""
    positions = default_positions(mask, *mask.shape, mask.device)
    batch_size, length = mask.shape
    out = torch.full((batch_size, 1, length, length), torch.finfo(torch.float32).min)
    for r in range(batch_size):
        for q in range(length):
            for k in range(length):
                if mask[r, k] and positions[r, k] // block <= positions[r, q] // block:
                    out[r, 0, q, k] = 0.0
    return out


def reference_logits(reference, ids, mask, block=BLOCK):
    positions = default_positions(mask, *ids.shape, ids.device)
    with torch.no_grad():
        return reference(ids, attention_mask=brute_force_block_mask(mask, block),
                         position_ids=positions).logits


def tiny_reference(kind: str, tied: bool = False, seed: int = 3):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                  max_position_embeddings=64, tie_word_embeddings=tied, eos_token_id=EOS,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, head_dim=8, attention_bias=False, mlp_bias=False))
    else:   # qwen3, with head_dim != hidden / heads, as Qwen3-4B has
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=12, attention_bias=False))
    model.config._attn_implementation = "eager"
    return randomize_(model, seed)


def released(directory: Path, reference, **keys):
    """`reference.save_pretrained` with the family's keys added to its config.json, then loaded."""
    reference.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **keys}))
    return load_model(directory)


FAST_DLLM_KEYS = dict(model_type="Fast_dLLM_Qwen", architectures=["Fast_dLLM_QwenForCausalLM"],
                      bd_size=BLOCK, mask_token_id=MASK)
PADDINGS = {"unpadded": (LENGTH, LENGTH), "left_padded": (LENGTH, 6)}


def assert_block_causal_not_causal(reference, ids, mask):
    """Guard: under the reference mask a query sees a later key of its own block, not of the next."""
    raw = reference_logits(reference, ids, mask)
    same_block, next_block = ids.clone(), ids.clone()
    same_block[0, 1] = (same_block[0, 1] + 1) % EOS       # block 0, after query 0
    next_block[0, BLOCK] = (next_block[0, BLOCK] + 1) % EOS
    assert (reference_logits(reference, same_block, mask)[0, 0] - raw[0, 0]).abs().amax() > 1e-4
    assert (reference_logits(reference, next_block, mask)[0, :BLOCK] - raw[0, :BLOCK]).abs().amax() == 0


def shift_like_fast_dllm(raw: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Reference un-shift: row i <- raw row i - 1; a sequence start (position 0) keeps its own."""
    shifted = torch.cat([raw[:, :1], raw[:, :-1]], dim=1)
    return torch.where((positions == 0).unsqueeze(-1), raw, shifted)


@pytest.mark.parametrize("padding", sorted(PADDINGS))
@pytest.mark.parametrize("tied", [False, True])
def test_fast_dllm_matches_qwen2_under_block_mask(tmp_path, tied, padding):
    reference = tiny_reference("qwen2", tied)
    model = released(tmp_path, reference, **FAST_DLLM_KEYS)
    assert type(model) is FastDLLMModel and model.block_size == BLOCK and model.token_shift == 1
    ids, mask = batch(PADDINGS[padding], seed=4)
    assert_block_causal_not_causal(reference, ids, mask)
    raw = reference_logits(reference, ids, mask)
    got = logits(model, ids, mask)
    positions = default_positions(mask, *ids.shape, ids.device)
    real = mask.bool()
    assert_logits_close(got[real], shift_like_fast_dllm(raw, positions)[real])
    if padding == "unpadded":           # the shift by hand: row 0 keeps its own, row i <- raw i - 1
        assert_logits_close(got[:, 0], raw[:, 0])
        assert_logits_close(got[:, 1:], raw[:, :-1])
        # so a block's first position reads the previous block's last row
        assert_logits_close(got[:, BLOCK], raw[:, BLOCK - 1])


def test_fast_dllm_llama_variant_matches_llama(tmp_path):
    """The embedded model's layout: Llama weights (no attention bias), `fast_dllm_llama`."""
    reference = tiny_reference("llama")
    model = released(tmp_path, reference, model_type="fast_dllm_llama", bd_size=BLOCK,
                     mask_token_id=MASK)
    assert type(model) is FastDLLMModel and model.config.attention_bias is False
    ids, mask = batch((LENGTH, 9), seed=5)
    raw = reference_logits(reference, ids, mask)
    positions = default_positions(mask, *ids.shape, ids.device)
    real = mask.bool()
    assert_logits_close(logits(model, ids, mask)[real],
                               shift_like_fast_dllm(raw, positions)[real])


@pytest.mark.parametrize("padding", sorted(PADDINGS))
@pytest.mark.parametrize("tied", [False, True])
def test_sdar_matches_qwen3_under_block_mask(tmp_path, tied, padding):
    reference = tiny_reference("qwen3", tied)
    model = released(tmp_path, reference, model_type="sdar", architectures=["SDARForCausalLM"],
                     block_size=BLOCK, mask_token_id=MASK)
    assert type(model) is SDARModel and model.block_size == BLOCK and model.token_shift == 0
    ids, mask = batch(PADDINGS[padding], seed=6)
    assert_block_causal_not_causal(reference, ids, mask)
    real = mask.bool()
    assert_logits_close(logits(model, ids, mask)[real],
                               reference_logits(reference, ids, mask)[real])


def test_fast_dllm_block_start_logit_is_fixed_while_its_block_decodes():
    """Row s (a block's first position) comes from raw row s - 1, which never sees block s:
    whatever the block's tokens, row s is unchanged (the reference commits it at once)."""
    model = tiny_block_diffusion("fast_dllm")
    ids, _ = batch((LENGTH,), seed=7)
    before = logits(model, ids)
    changed = ids.clone()
    changed[:, BLOCK:2 * BLOCK] = MASK                    # the whole block 1, position 4 included
    after = logits(model, changed)
    torch.testing.assert_close(after[:, :BLOCK + 1], before[:, :BLOCK + 1], atol=0, rtol=0)
    assert (after[:, BLOCK + 1:2 * BLOCK] - before[:, BLOCK + 1:2 * BLOCK]).abs().amax() > 1e-3


# ---- the block-causal contract, every family --------------------------------------------------

@pytest.fixture(params=BLOCK_DIFFUSION_FAMILIES)
def family(request) -> str:
    return request.param


def test_satisfies_protocol(family):
    model = tiny_block_diffusion(family, block_size=BLOCK)
    assert isinstance(model, DiffusionLM) and model.supports_kv and model.block_size == BLOCK
    assert model.vocab_size == VOCAB and model.mask_token_id == MASK and model.eos_token_ids == (EOS,)
    ids, mask = batch()
    out = logits(model, ids, mask)
    assert out.shape == (2, LENGTH, VOCAB) and out.dtype == torch.float32 and out.isfinite().all()


@pytest.mark.parametrize("block", [0, 1, 2])
def test_later_block_never_changes_earlier_blocks(family, block):
    """Changing a token in block j + 1 leaves the logits of blocks <= j unchanged; changing one
    in block j changes block j's own logits."""
    model = tiny_block_diffusion(family)
    ids, _ = batch((LENGTH,), seed=8)
    base = logits(model, ids)
    later, own = ids.clone(), ids.clone()
    later[:, (block + 1) * BLOCK] = MASK
    own[:, block * BLOCK + 2] = MASK
    end = (block + 1) * BLOCK
    assert_logits_close(logits(model, later)[:, :end], base[:, :end])
    assert (logits(model, own)[:, block * BLOCK:end] - base[:, block * BLOCK:end]).abs().amax() > 1e-3


def test_left_padding_keeps_the_grid(family):
    """Blocks come from positions, so a left-padded row equals the same tokens alone, whatever
    the pad columns hold (pad length 5: not a multiple of the block)."""
    model = tiny_block_diffusion(family)
    ids, mask = batch((LENGTH, LENGTH - 5), seed=9)
    alone = logits(model, ids[1:, 5:])
    for pad_id in (0, MASK):
        padded = ids.clone()
        padded[1, :5] = pad_id
        assert_logits_close(logits(model, padded, mask)[1:, 5:], alone)


def test_batch_rows_are_independent(family):
    model = tiny_block_diffusion(family)
    ids, mask = batch((LENGTH, 5, 9), seed=10)
    batched = logits(model, ids, mask)
    for row in range(3):
        assert_logits_close(batched[row:row + 1], logits(model, ids[row:row + 1], mask[row:row + 1]))


def test_rows_slice_the_full_forward(family):
    model = tiny_block_diffusion(family)
    ids, mask = batch(seed=11)
    full = logits(model, ids, mask)
    for rows in [(0, LENGTH), (0, 1), (4, 8), (5, 8), (LENGTH - 1, LENGTH)]:
        assert_logits_close(logits(model, ids, mask, rows=rows), full[:, rows[0]:rows[1]])


# ---- the finished-block cache is exact ----------------------------------------------------------

CANVAS, PROMPT = 16, 6


def decode_walk(model, ids, mask, write_finished: bool = True, fused: bool = False):
    """Walk blocks 1..3 as a block decoder does, yielding (cached, uncached) logits of each step.

    Prefill fills the cache; each step of block [s, e) forwards `rows=(s, e)` with the cache
    after committing one more token; when a block is final its K/V are written by a KV-write
    forward over it (`write_finished`), or fused with the next block's first step (`fused`).
    """
    kv = KVCache()
    generator = torch.Generator().manual_seed(12)
    yield logits(model, ids, mask, kv=kv), logits(model, ids, mask)
    for block in (1, 2, 3):
        start, end = block * BLOCK, (block + 1) * BLOCK
        first = start - BLOCK if fused and block > 1 else start
        for step, col in enumerate(range(max(start, PROMPT), end)):
            rows = (first, end) if step == 0 else (start, end)
            cached = logits(model, ids, mask, kv=kv, rows=rows)[:, start - rows[0]:]
            yield cached, logits(model, ids, mask)[:, start:end]
            ids[:, col] = torch.randint(0, EOS, (ids.shape[0],), generator=generator)
        if write_finished and not fused:
            logits(model, ids, mask, kv=kv, rows=(start, end))     # KV-write forward


def canvas_batch():
    """Two rows: one unpadded, one left-padded by a whole block (same grid in canvas columns)."""
    ids, mask = batch((CANVAS, CANVAS - BLOCK), seed=13, length=CANVAS)
    ids[:, PROMPT:] = MASK
    return ids, mask


@pytest.mark.parametrize("fused", [False, True], ids=["kv_write", "fused"])
def test_finished_block_cache_equals_recompute_at_every_step(family, fused):
    model = tiny_block_diffusion(family, layers=2)
    ids, mask = canvas_batch()
    steps = list(decode_walk(model, ids, mask, fused=fused))
    assert len(steps) == 1 + (2 * BLOCK - PROMPT) + 2 * BLOCK
    for cached, uncached in steps:
        assert_logits_close(cached, uncached)


def test_cache_without_kv_write_goes_stale(family):
    """Guard: K/V written while a block still held masks are wrong once it is final."""
    model = tiny_block_diffusion(family, layers=2)
    ids, mask = canvas_batch()
    worst = max((c - u).abs().amax().item() for c, u in decode_walk(model, ids, mask, write_finished=False))
    assert worst > 1e-3


# ---- LLaDA2 MoE by hand ---------------------------------------------------------------------

def test_group_limited_topk_by_hand():
    # 8 experts in 4 groups of 2. Expert 0 is the single best, but its group's top-2 sum
    # (0.9 + 0.0) loses to groups 1 (0.5 + 0.5) and 3 (0.6 + 0.45): with 2 groups kept,
    # the choice is within experts 2, 3, 6, 7.
    scores = torch.tensor([[0.9, 0.0, 0.5, 0.5, 0.1, 0.1, 0.6, 0.45]])
    assert group_limited_topk(scores, 2, n_group=4, topk_group=2).tolist() == [[6, 2]]
    assert group_limited_topk(scores, 2, n_group=4, topk_group=3).tolist() == [[0, 6]]
    assert group_limited_topk(scores, 2, n_group=1, topk_group=1).tolist() == [[0, 6]]


def router(score_function="sigmoid", norm=True, bias=(0.0,) * 4, scale=2.5, k=2):
    cfg = LLaDA2Config(hidden_size=4, num_attention_heads=1, head_dim=4, num_experts=4,
                       num_experts_per_tok=k, n_group=1, topk_group=1, moe_intermediate_size=3,
                       routed_scaling_factor=scale, score_function=score_function,
                       norm_topk_prob=norm, vocab_size=10, mask_token_id=9)
    gate = LLaDA2Router(cfg)
    with torch.no_grad():
        gate.weight.copy_(torch.eye(4))          # logits = the token's hidden vector
        gate.expert_bias.copy_(torch.tensor(bias))
    return gate


def test_router_weights_by_hand():
    x = torch.tensor([[2.0, 0.0, 1.0, -1.0]])
    s = torch.sigmoid(x[0])                      # 0.881, 0.5, 0.731, 0.269
    experts, weights = router()(x)
    assert experts.tolist() == [[0, 2]]
    torch.testing.assert_close(weights, 2.5 * torch.stack([s[0], s[2]])[None] / (s[0] + s[2]))
    # The expert bias changes the CHOICE (expert 3 now ranks first) but never the weights.
    experts, weights = router(bias=(0.0, 0.0, 0.0, 1.0))(x)
    assert experts.tolist() == [[3, 0]]
    torch.testing.assert_close(weights, 2.5 * torch.stack([s[3], s[0]])[None] / (s[3] + s[0]))
    # Without normalisation: raw sigmoid scores times the scaling factor.
    _, weights = router(norm=False, scale=1.0)(x)
    torch.testing.assert_close(weights, torch.stack([s[0], s[2]])[None])
    # Softmax scoring.
    p = x[0].softmax(-1)
    _, weights = router(score_function="softmax", scale=1.0)(x)
    torch.testing.assert_close(weights, torch.stack([p[0], p[2]])[None] / (p[0] + p[2]))


def test_moe_adds_routed_experts_and_the_shared_one():
    cfg = LLaDA2Config(hidden_size=4, num_attention_heads=1, head_dim=4, num_experts=4,
                       num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=3,
                       num_shared_experts=2, routed_scaling_factor=2.5, vocab_size=10,
                       mask_token_id=9)
    moe = randomize_(LLaDA2MoE(cfg), seed=14)
    assert moe.shared_experts.gate_proj.weight.shape == (6, 4)          # width 3 x 2 shared
    h = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(15))
    x = h.reshape(-1, 4)
    experts, weights = moe.gate(x)
    expected = moe.shared_experts(x).clone()
    for t in range(x.shape[0]):
        for slot in range(2):
            expected[t] += weights[t, slot] * moe.experts[int(experts[t, slot])](x[t])
    with torch.no_grad():
        torch.testing.assert_close(moe(h), expected.view(h.shape).detach(), atol=1e-5, rtol=1e-5)


def test_partial_rotary_leaves_the_tail_unrotated():
    x = torch.randn(1, 2, 3, 8)
    cos, sin = rope_tables(torch.arange(3)[None], 4, 10000.0)      # rotate 4 of 8 dims
    out = apply_rope(x, cos, sin, full_precision=False)
    torch.testing.assert_close(out[..., 4:], x[..., 4:], atol=0, rtol=0)
    torch.testing.assert_close(out[..., :4], apply_rope(x[..., :4], cos, sin, False), atol=0, rtol=0)
    assert (out[:, :, 1:, :4] - x[:, :, 1:, :4]).abs().amax() > 1e-3


def test_llada2_layers_dense_then_moe():
    model = tiny_block_diffusion("llada2", layers=3)
    kinds = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert kinds == ["SwiGLU", "LLaDA2MoE", "LLaDA2MoE"]
    assert model.rotary_dim() == 4 and model.token_shift == 0


# ---- loading and config validation ----------------------------------------------------------

@pytest.mark.parametrize("family", BLOCK_DIFFUSION_FAMILIES)
def test_round_trip_in_released_layout(tmp_path, family):
    model = tiny_block_diffusion(family, layers=2)
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, runtime="reference")      # the in-memory model's own path
    assert type(loaded) is type(model) and loaded.block_size == model.block_size
    ids, mask = batch(seed=16)
    torch.testing.assert_close(logits(loaded, ids, mask), logits(model, ids, mask), atol=0, rtol=0)
    # the default runtime (compact where it covers the family) equals it to float rounding
    assert_logits_close(logits(load_model(tmp_path), ids, mask), logits(model, ids, mask))


def test_llada2_released_names_and_missing_use_bias(tmp_path):
    """The names of `inclusionAI/LLaDA2.0-mini`; a file without `use_bias` reads the bias off the
    checkpoint (the reference defaults it to true and zero-fills a missing tensor)."""
    model = tiny_block_diffusion("llada2", layers=2)
    names = set(model.state_dict())
    assert {"model.word_embeddings.weight", "model.layers.0.attention.query_key_value.weight",
            "model.layers.0.attention.query_layernorm.weight", "model.layers.0.attention.dense.weight",
            "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.gate.weight",
            "model.layers.1.mlp.gate.expert_bias", "model.layers.1.mlp.experts.7.down_proj.weight",
            "model.layers.1.mlp.shared_experts.up_proj.weight", "model.norm.weight",
            "lm_head.weight"} <= names
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["use_bias"], config["block_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_model(tmp_path)
    assert loaded.config.use_bias is False and loaded.block_size == 32     # the reference default


def load_error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("family, key", [("fast_dllm", "bd_size"), ("sdar", "block_size"),
                                         ("llada2", "block_size")])
@pytest.mark.parametrize("value", [0, -4, 2.5, "8"])
def test_bad_block_size_names_directory_and_key(tmp_path, family, key, value):
    tiny_block_diffusion(family).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))
    message = load_error(tmp_path)
    assert str(tmp_path / "config.json") in message and key in message and repr(value) in message


@pytest.mark.parametrize("family, key", [("fast_dllm", "bd_size"), ("sdar", "block_size")])
def test_missing_block_size_is_refused(tmp_path, family, key):
    tiny_block_diffusion(family).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config[key]
    (tmp_path / "config.json").write_text(json.dumps(config))
    message = load_error(tmp_path)
    assert str(tmp_path) in message and key in message


@pytest.mark.parametrize("family", BLOCK_DIFFUSION_FAMILIES)
def test_mask_id_outside_vocabulary_is_refused(tmp_path, family):
    tiny_block_diffusion(family).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "mask_token_id": VOCAB}))
    message = load_error(tmp_path)
    assert str(tmp_path) in message and "mask_token_id" in message and str(VOCAB) in message


def test_fast_dllm_default_mask_id_must_fit_the_vocabulary(tmp_path):
    """The released config has no mask key: 151665 is assumed, and a tiny vocab refuses it."""
    reference = tiny_reference("qwen2")
    reference.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "Fast_dLLM_Qwen",
                                                      "bd_size": 32}))
    assert "mask_token_id 151665" in load_error(tmp_path)


@pytest.mark.parametrize("key", ["use_sliding_window", "mlp_bias"])
def test_unsupported_structure_is_refused(tmp_path, key):
    tiny_block_diffusion("sdar").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: True}))
    assert f"{key}=true is not supported" in load_error(tmp_path)


def test_sdar_moe_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "sdar_moe"}))
    assert "sdar_moe" in load_error(tmp_path)


def test_the_shipped_block_diffusion_model_decodes_with_its_exact_cache():
    """`embedded-bd` loads by name as a block-8 Fast-dLLM v2 model, answers a task prompt, and
    the block cache gives the uncached decode's tokens in the same number of forwards."""
    from dllm_decode import DecodeConfig, generate, load_model
    from dllm_decode.caches import BlockCache
    from dllm_decode.schedulers import ThresholdScheduler

    model = load_model("embedded-bd")
    assert type(model) is FastDLLMModel and model.block_size == 8
    prompts = [model.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                   add_generation_prompt=True)
               for p in ("sort : mia ella hank", "reverse : carl jack andrew")]
    config = DecodeConfig(scheduler=ThresholdScheduler(0.9), gen_length=32, block_length=8)
    plain = generate(model, prompts, config)
    cached = generate(model, prompts, DecodeConfig(scheduler=ThresholdScheduler(0.9), cache=BlockCache(),
                                                   gen_length=32, block_length=8))
    assert plain.text == ["ella hank mia", "andrew jack carl"]
    assert_decodes_agree(cached, plain)             # two compute paths: a near tie may move a row
