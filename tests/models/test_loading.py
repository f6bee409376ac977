"""`load_model` on tiny checkpoints in each on-disk layout, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dllm_decode.models import (DreamModel, HFMaskedLM, LLaDAModelLM, ModelLoadError,
                                load_model)
from dllm_decode.testing import assert_logits_close
from tests.models.conftest import (LENGTH, left_padded_batch, make_dream, make_llada,
                                   write_bert_dir, write_sharded)


def same_logits(a, b) -> None:
    """Equal logits, bit for bit: both models must run the same compute path."""
    ids, mask = left_padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(a(ids, attention_mask=mask), b(ids, attention_mask=mask),
                                   atol=0, rtol=0)


def round_trip(path: Path, model) -> None:
    """The layout loads back: with the reference blocks (the in-memory model's path) the logits
    are bit-equal; with the default (compact) runtime, equal to float rounding."""
    same_logits(load_model(path, runtime="reference"), model)
    ids, mask = left_padded_batch()
    with torch.no_grad():
        assert_logits_close(load_model(path)(ids, attention_mask=mask), model(ids, attention_mask=mask))


def load_error(path: Path | str) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    message = str(info.value)
    assert "\n" not in message and message
    return message


# ---- round trips ----------------------------------------------------------------------------

LLADA_NAMES = {"model.transformer.wte.weight", "model.transformer.ln_f.weight",
               "model.transformer.ff_out.weight"} | {
    f"model.transformer.blocks.0.{m}.weight" for m in
    ("attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out")}
DREAM_NAMES = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
               "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
               "model.layers.0.self_attn.o_proj.weight"} | {
    f"model.layers.0.self_attn.{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")} | {
    f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}


@pytest.mark.parametrize("make, names, cls", [(make_llada, LLADA_NAMES, LLaDAModelLM),
                                              (make_dream, DREAM_NAMES, DreamModel)],
                         ids=["llada", "dream"])
def test_single_file_round_trip_in_released_layout(tmp_path, make, names, cls):
    model = make(layers=1)
    model.save_pretrained(tmp_path)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == names   # the released names
    loaded = load_model(tmp_path)
    assert type(loaded) is cls and not loaded.training and loaded.tokenizer is None
    assert loaded.name_or_path == str(tmp_path)
    round_trip(tmp_path, model)


def test_sharded_llada_round_trip(tmp_path):
    model = make_llada()
    write_sharded(model, model.config.to_dict(), tmp_path, shards=3)
    assert not (tmp_path / "model.safetensors").exists()
    round_trip(tmp_path, model)


def test_dtype_argument_and_bf16_checkpoint(tmp_path):
    model = make_dream()
    model.save_pretrained(tmp_path, dtype=torch.bfloat16)
    assert load_model(tmp_path).model.norm.weight.dtype == torch.float32
    loaded = load_model(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_tied_dream_ignores_a_stored_head_copy(tmp_path):
    model = make_dream(tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in state
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(tmp_path / "model.safetensors"))
    round_trip(tmp_path, model)


def test_bert_checkpoint_loads_through_the_generic_adapter(tmp_path):
    write_bert_dir(tmp_path)
    loaded = load_model(tmp_path)
    assert isinstance(loaded, HFMaskedLM) and not loaded.supports_kv
    assert (loaded.mask_token_id, loaded.eos_token_ids) == (4, (3,))   # [MASK], [SEP]
    assert loaded.tokenizer.mask_token == "[MASK]" and loaded.max_length == 64
    ids, mask = left_padded_batch((LENGTH, LENGTH))
    with torch.no_grad():
        raw = loaded.model(input_ids=ids).logits
        torch.testing.assert_close(loaded(ids), raw)


# ---- the released config.json structure (values from the spec tables, sizes shrunk) ---------

LLADA_8B_CONFIG = {  # GSAI-ML/LLaDA-8B-Instruct's config.json keys; sizes shrunk
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
    "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0, "attention_layer_norm": False,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                 "AutoModel": "modeling_llada.LLaDAModelLM",
                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama",
    "d_model": 32, "embedding_dropout": 0.0, "embedding_size": 40, "eos_token_id": 35,
    "flash_attention": False, "include_bias": False, "include_qkv_bias": False,
    "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02,
    "input_emb_norm": False, "layer_norm_type": "rms", "layer_norm_with_affine": True,
    "mask_token_id": 36, "max_sequence_length": 64, "mlp_hidden_size": 48, "mlp_ratio": 4,
    "model_type": "llada", "multi_query_attention": None, "n_heads": 4, "n_kv_heads": 4,
    "n_layers": 2, "pad_token_id": 35, "precision": "amp_bf16", "residual_dropout": 0.0,
    "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0,
    "scale_logits": False, "transformers_version": "4.46.3", "use_cache": False,
    "vocab_size": 37, "weight_tying": False,
}
DREAM_7B_CONFIG = {  # Dream-v0-Instruct-7B's config.json keys plus HF bookkeeping; sizes shrunk
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                 "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643, "eos_token_id": 35, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 48, "mask_token_id": 36,
    "max_position_embeddings": 64, "max_window_layers": 2, "model_type": "Dream",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "pad_token_id": 35, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
    "sliding_window": 64, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.2", "use_cache": False, "use_sliding_window": False,
    "vocab_size": 37,
}


def write_released(directory: Path, config: dict, model_from_config) -> torch.nn.Module:
    """Weights shaped by our reading of `config`, stored next to the released-style config.json."""
    model = model_from_config(config)
    model.save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return model


def test_released_llada_config_parses(tmp_path):
    from dllm_decode.models import LLaDAConfig

    write_released(tmp_path, LLADA_8B_CONFIG, lambda c: make_llada(**{
        k: v for k, v in c.items() if k in {"embedding_size", "max_sequence_length"}}))
    model = load_model(tmp_path)
    assert model.config == LLaDAConfig(d_model=32, n_heads=4, n_kv_heads=4, n_layers=2,
                                       mlp_hidden_size=48, vocab_size=37, embedding_size=40,
                                       max_sequence_length=64, mask_token_id=36, eos_token_id=35,
                                       pad_token_id=35)
    assert model.vocab_size == 40 and model.mask_token_id == 36 and model.eos_token_ids == (35,)


def test_released_dream_config_parses(tmp_path):
    from dllm_decode.models import DreamConfig

    write_released(tmp_path, DREAM_7B_CONFIG, lambda c: make_dream())
    model = load_model(tmp_path)
    assert type(model) is DreamModel
    assert model.config == DreamConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=48, vocab_size=37,
                                       rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=64,
                                       mask_token_id=36, eos_token_id=35, pad_token_id=35)
    assert model.max_length == 64 and model.eos_token_ids == (35,)


def test_dream_eos_list_and_nested_rope_theta(tmp_path):
    config = {**DREAM_7B_CONFIG, "eos_token_id": [35, 34], "rope_parameters":
              {"rope_type": "default", "rope_theta": 12345.0}}
    del config["rope_theta"], config["rope_scaling"]
    write_released(tmp_path, config, lambda c: make_dream())
    model = load_model(tmp_path)
    assert model.eos_token_ids == (35, 34) and model.config.rope_theta == 12345.0


# ---- errors: one line, naming the problem ---------------------------------------------------

def saved_llada(directory: Path) -> Path:
    make_llada(layers=1).save_pretrained(directory)
    return directory


def edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))


def edit_weights(directory: Path, edit) -> None:
    state = load_file(str(directory / "model.safetensors"))
    edit(state)
    save_file(state, str(directory / "model.safetensors"))


def test_missing_directory(tmp_path):
    assert "does not exist" in load_error(tmp_path / "nope")
    assert "does not exist" in load_error(str(tmp_path / "a" / "b" / "c"))


@pytest.mark.parametrize("damage, expected", [
    (lambda d: (d / "config.json").unlink(), "has no config.json"),
    (lambda d: (d / "config.json").write_text("{oops"), "is not valid JSON"),
    (lambda d: (d / "config.json").write_text("[1, 2]"), "must hold a JSON object"),
    (lambda d: (d / "model.safetensors").unlink(), "has no model.safetensors"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 5), "cannot read"),
    (lambda d: (d / "model.safetensors").write_bytes(b"garbage" * 100), "cannot read"),
    (lambda d: (d / "model.safetensors.index.json").write_text("{}"), "is not a safetensors index"),
    (lambda d: (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-00001-of-00002.safetensors"}})), "cannot read"),
    (lambda d: edit_weights(d, lambda s: s.pop("model.transformer.ln_f.weight")), "missing"),
    (lambda d: edit_weights(d, lambda s: s.update(extra=torch.zeros(2))), "unexpected ['extra']"),
    (lambda d: edit_config(d, vocab_size=41), "shape of model.transformer"),
    (lambda d: edit_config(d, n_heads=5), "must be divisible by n_heads (5)"),
    (lambda d: edit_config(d, n_kv_heads=3), "must be a multiple of n_kv_heads (3)"),
    (lambda d: edit_config(d, d_model="wide"), "config.json"),
    (lambda d: edit_config(d, block_type="sequential"), "block_type='sequential' is not supported"),
    (lambda d: edit_config(d, d_model=None), "lacks required key(s) ['d_model']"),
    (lambda d: edit_config(d, model_type="foo"), "model_type 'foo' is not a diffusion LM"),
    (lambda d: edit_config(d, model_type=None, architectures=None), "model_type None"),
], ids=["no-config", "bad-json", "json-list", "no-weights", "truncated-weights", "garbage-weights",
        "bad-index", "index-missing-shard", "missing-tensor", "extra-tensor", "wrong-shape",
        "heads", "kv-heads", "wrong-type", "unsupported-structure", "missing-size-key",
        "unknown-type", "no-type"])
def test_broken_llada_directory(tmp_path, damage, expected):
    damage(saved_llada(tmp_path))
    assert expected in load_error(tmp_path)


@pytest.mark.parametrize("change, expected", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope type 'linear' is not supported"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads (3)"),
    ({"hidden_size": None}, "lacks required key(s) ['hidden_size']"),
    ({"intermediate_size": 50}, "shape of model.layers.0.mlp"),
])
def test_broken_dream_config(tmp_path, change, expected):
    make_dream(layers=1).save_pretrained(tmp_path)
    edit_config(tmp_path, **change)
    assert expected in load_error(tmp_path)


def test_causal_lm_directory_points_to_the_ar_mode(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=37, hidden_size=16, intermediate_size=24,
                                 num_hidden_layers=1, num_attention_heads=2)).save_pretrained(tmp_path)
    message = load_error(tmp_path)
    assert "causal" in message and "masked LM" in message and "AR/speculative" in message
    edit_config(tmp_path, model_type="qwen2", architectures=None)  # decided from model_type alone
    assert "model_type 'qwen2' is a causal" in load_error(tmp_path)


def test_masked_lm_needs_a_tokenizer_with_a_mask_token(tmp_path):
    write_bert_dir(tmp_path / "nomask", mask_token=None)
    assert "has no mask token" in load_error(tmp_path / "nomask")
    write_bert_dir(tmp_path / "notok")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "notok" / name).unlink()
    assert "has no tokenizer" in load_error(tmp_path / "notok")


def test_masked_lm_with_missing_weights_is_refused(tmp_path):
    write_bert_dir(tmp_path)
    edit_weights(tmp_path, lambda s: s.pop(next(k for k in s if "attention.self.query.weight" in k)))
    assert "weights do not match" in load_error(tmp_path)


@pytest.mark.parametrize("architectures, causal", [(None, False), (["BertLMHeadModel"], True)])
def test_generic_fallback_reads_architectures_then_model_type(tmp_path, architectures, causal):
    write_bert_dir(tmp_path)
    edit_config(tmp_path, architectures=architectures)
    if causal:
        assert "is a causal (autoregressive) LM" in load_error(tmp_path)
    else:
        assert isinstance(load_model(tmp_path), HFMaskedLM)


@pytest.mark.parametrize("key, value, fragment", [
    ("mask_token_id", 999, "mask_token_id 999 is outside the vocabulary [0, 37)"),
    ("eos_token_id", -1, "eos_token_id -1 is outside the vocabulary"),
    ("eos_token_id", 36, "also an eos_token_id"),
])
def test_special_ids_outside_the_vocabulary_are_named_load_errors(tmp_path, key, value, fragment):
    import json

    from dllm_decode.models import ModelLoadError, load_model
    from dllm_decode.testing import tiny_llada

    tiny_llada().save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config[key] = value
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="config.json") as raised:
        load_model(tmp_path / "m")
    assert fragment in str(raised.value)
