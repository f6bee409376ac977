"""Tiny checkpoints of every family `dllm-decode verify` covers, each with a small INDEPENDENT
reference modeling file in the folder and an `auto_map` in config.json, as the releases ship
their own code: transformers' Llama (LLaDA, its names mapped) and Qwen2 (Dream) with no causal
mask, Qwen2 (Fast-dLLM v2) and Qwen3 (SDAR) under the block-causal mask, each written in a
few lines here and sharing no code with the port. The masked LM (BERT) needs no file: its
reference is transformers' own class.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

REFERENCE = '''"""Reference modeling code of a test checkpoint: {what}."""

import os

import torch
from safetensors.torch import load_file
from transformers import PretrainedConfig, PreTrainedModel
from transformers import {backbone}Config as BackboneConfig, {backbone}ForCausalLM as Backbone
from transformers.modeling_outputs import MaskedLMOutput

BLOCK_KEY = {block_key!r}          # config key of the block size; None: bidirectional
LLADA_TO_LLAMA = {{"attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj",
                  "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj",
                  "ff_norm": "post_attention_layernorm", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                  "ff_out": "mlp.down_proj"}}
LLADA_TOP = {{"model.transformer.wte.weight": "model.embed_tokens.weight",
             "model.transformer.ln_f.weight": "model.norm.weight",
             "model.transformer.ff_out.weight": "lm_head.weight"}}


def rename(name):
    if not name.startswith("model.transformer."):
        return name
    if name in LLADA_TOP:
        return LLADA_TOP[name]
    _, _, _, layer, module, param = name.split(".")
    return f"model.layers.{{layer}}.{{LLADA_TO_LLAMA[module]}}.{{param}}"


def backbone_config(c):
    if getattr(c, "d_model", None):               # LLaDA's config names
        return BackboneConfig(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.mlp_hidden_size,
                              num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                              num_key_value_heads=c.n_kv_heads, rms_norm_eps=c.rms_norm_eps,
                              max_position_embeddings=c.max_sequence_length, tie_word_embeddings=False,
                              rope_parameters={{"rope_type": "default", "rope_theta": c.rope_theta}},
                              attention_bias=False, mlp_bias=False)
    keys = {{k: v for k, v in c.to_dict().items() if k not in ("model_type", "auto_map", "architectures")}}
    if "rope_theta" in keys:
        keys["rope_parameters"] = {{"rope_type": "default", "rope_theta": keys.pop("rope_theta")}}
    return BackboneConfig(**keys)


class RefConfig(PretrainedConfig):
    model_type = {model_type!r}


class RefModel(PreTrainedModel):
    config_class = RefConfig

    def __init__(self, config):
        super().__init__(config)
        net = backbone_config(config)
        net._attn_implementation = "eager"
        self.net = Backbone(net)

    @classmethod
    def from_pretrained(cls, path, *args, config=None, dtype=None, **kwargs):
        model = cls(config if config is not None else RefConfig.from_pretrained(path))
        state = {{rename(k): v for k, v in load_file(os.path.join(path, "model.safetensors")).items()}}
        missing, unexpected = model.net.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {{"lm_head.weight"}}:
            raise ValueError(f"weights do not fit: missing {{missing}}, unexpected {{unexpected}}")
        if missing:                               # tied head
            model.net.lm_head.weight = model.net.model.embed_tokens.weight
        return model.to(dtype or torch.float32).eval()

    def forward(self, input_ids, **kwargs):
        n = input_ids.shape[1]
        pos = torch.arange(n, device=input_ids.device)
        block = getattr(self.config, BLOCK_KEY) if BLOCK_KEY else None
        allowed = (pos[None, :] // block <= pos[:, None] // block) if block else torch.ones(n, n, dtype=torch.bool)
        mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
        return MaskedLMOutput(logits=self.net(input_ids, attention_mask=mask, position_ids=pos[None]).logits)
'''

VOCAB, MASK, EOS, BLOCK = 37, 36, 35, 4
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
              eos_token_id=EOS, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def _ship(directory: Path, what: str, backbone: str, model_type: str, block_key: str | None,
          auto: str = "AutoModel") -> Path:
    """Add the reference file and `auto_map` to the checkpoint in `directory`."""
    (directory / "modeling_ref.py").write_text(REFERENCE.format(what=what, backbone=backbone, model_type=model_type,
                                                                block_key=block_key))
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_ref.RefConfig", auto: "modeling_ref.RefModel"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _released(directory: Path, model, **keys) -> None:
    """`model.save_pretrained` with the family's keys added to its config.json."""
    from tests.models.conftest import randomize_

    randomize_(model, 3).save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **keys}))


def write_llada(directory: Path) -> Path:
    from tests.models.conftest import make_llada

    make_llada().save_pretrained(directory)
    return _ship(directory, "LLaDA as transformers' Llama with LLaDA's names and no causal mask", "Llama",
                 "llada", None)


def write_dream(directory: Path) -> Path:
    from tests.models.conftest import make_dream

    make_dream().save_pretrained(directory)
    return _ship(directory, "Dream as transformers' Qwen2 with no causal mask (logits shifted)", "Qwen2",
                 "Dream", None)


def write_fast_dllm(directory: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _released(directory, Qwen2ForCausalLM(Qwen2Config(**COMMON)), model_type="Fast_dLLM_Qwen",
              architectures=["Fast_dLLM_QwenForCausalLM"], bd_size=BLOCK, mask_token_id=MASK)
    return _ship(directory, "Fast-dLLM v2 as transformers' Qwen2 under the block-causal mask", "Qwen2",
                 "Fast_dLLM_Qwen", "bd_size", auto="AutoModelForCausalLM")


def write_sdar(directory: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    _released(directory, Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=12, attention_bias=False)),
              model_type="sdar", architectures=["SDARForCausalLM"], block_size=BLOCK, mask_token_id=MASK)
    return _ship(directory, "SDAR as transformers' Qwen3 under the block-causal mask", "Qwen3", "sdar",
                 "block_size", auto="AutoModelForCausalLM")


def write_masked_lm(directory: Path) -> Path:
    """A BERT masked LM with a tokenizer (its [MASK] and [SEP] ids): transformers' own class."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(VOCAB - 5))]
    (directory / "vocab.txt").parent.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(words) + "\n")
    BertTokenizerFast(vocab_file=str(directory / "vocab.txt")).save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64)
    BertForMaskedLM(config).eval().save_pretrained(directory)
    return directory


WRITERS = {"llada": write_llada, "dream": write_dream, "fast_dllm": write_fast_dllm, "sdar": write_sdar,
           "masked_lm": write_masked_lm}
