"""Tiny checkpoints of every family `dllm-decode verify` covers, each with a small INDEPENDENT
reference modeling file in the folder and an `auto_map` in config.json, as the releases ship
their own code: transformers' Llama (LLaDA, its names mapped) and Qwen2 (Dream) with no causal
mask, Qwen2 (Fast-dLLM v2) and Qwen3 (SDAR) under the block-causal mask, and LLaDA2's MoE
written out by hand from its released description (transformers has no LLaDA2 class: one token at
a time through the group-limited router, plain-matrix attention with partial rotary), each sharing
no code with the port. The masked LM (BERT) needs no file: its reference is transformers' own class.
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

LLADA2_REFERENCE = '''"""Reference modeling code of a test checkpoint: LLaDA2 (Ling-2.0 MoE as a block-diffusion
model), by hand over the released weight names, one token at a time through the router."""

import math
import os

import torch
from safetensors.torch import load_file
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput


class RefConfig(PretrainedConfig):
    model_type = "llada2_moe"


def norm(x, weight, eps):
    x32 = x.float()
    return weight * (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def swiglu(x, w, prefix):
    gate = x @ w(prefix + "gate_proj.weight").T
    return (torch.nn.functional.silu(gate) * (x @ w(prefix + "up_proj.weight").T)) @ w(prefix + "down_proj.weight").T


class RefModel(PreTrainedModel):
    config_class = RefConfig

    def __init__(self, config, state=None):
        super().__init__(config)
        self.weights = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v, requires_grad=False)
                                               for k, v in (state or {}).items()})

    def w(self, name):
        return self.weights[name.replace(".", "__")]

    @classmethod
    def from_pretrained(cls, path, *args, config=None, dtype=None, **kwargs):
        config = config if config is not None else RefConfig.from_pretrained(path)
        model = cls(config, load_file(os.path.join(path, "model.safetensors")))
        return model.to(dtype or torch.float32).eval()

    def route(self, scores, bias):
        c = self.config
        choose = scores + bias if bias is not None else scores
        if c.n_group > 1:
            size = c.num_experts // c.n_group
            groups = choose.view(c.n_group, size).topk(min(2, size)).values.sum(-1)
            masked = torch.full_like(choose, -math.inf)
            for g in groups.topk(c.topk_group).indices.tolist():
                masked[g * size:(g + 1) * size] = choose[g * size:(g + 1) * size]
            choose = masked
        top = choose.topk(c.num_experts_per_tok).indices
        weights = scores[top]
        if c.norm_topk_prob and c.num_experts_per_tok > 1:
            weights = weights / (weights.sum() + 1e-20)
        return top.tolist(), weights * c.routed_scaling_factor

    def moe(self, x, prefix):
        c = self.config
        flat = x.reshape(-1, x.shape[-1])
        logits = flat.float() @ self.w(prefix + "gate.weight").float().T
        scores = logits.sigmoid() if c.score_function == "sigmoid" else logits.softmax(-1)
        bias_name = (prefix + "gate.expert_bias").replace(".", "__")
        bias = self.weights[bias_name].float() if bias_name in self.weights else None
        out = torch.zeros_like(flat, dtype=torch.float32)
        for t in range(flat.shape[0]):
            experts, weights = self.route(scores[t], bias)
            for e, weight in zip(experts, weights):
                out[t] += weight * swiglu(flat[t], self.w, f"{prefix}experts.{e}.").float()
        out = out.to(x.dtype).view(x.shape)
        if c.num_shared_experts:
            out = out + swiglu(x, self.w, prefix + "shared_experts.")
        return out

    def forward(self, input_ids, **kwargs):
        c, w = self.config, self.w
        n = input_ids.shape[1]
        pos = torch.arange(n, device=input_ids.device)
        allowed = pos[None, :] // c.block_size <= pos[:, None] // c.block_size
        heads, kv_heads = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
        dim = c.head_dim or c.hidden_size // heads
        rot = int(dim * c.partial_rotary_factor)
        angles = pos[:, None].float() / c.rope_theta ** (torch.arange(0, rot, 2).float() / rot)
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)

        def rope(x):
            head, rest = x[..., :rot], x[..., rot:]
            turned = torch.cat([-head[..., rot // 2:], head[..., :rot // 2]], -1)
            return torch.cat([head * cos + turned * sin, rest], -1)

        h = w("model.word_embeddings.weight")[input_ids]
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv = norm(h, w(p + "input_layernorm.weight"), c.rms_norm_eps) @ w(p + "attention.query_key_value.weight").T
            if c.use_qkv_bias:
                qkv = qkv + w(p + "attention.query_key_value.bias")
            q, k, v = (t.unflatten(-1, (-1, dim)).transpose(1, 2)
                       for t in qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], -1))
            if c.use_qk_norm:
                q = norm(q, w(p + "attention.query_layernorm.weight"), c.rms_norm_eps)
                k = norm(k, w(p + "attention.key_layernorm.weight"), c.rms_norm_eps)
            q, k = rope(q), rope(k)
            k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
            scores = (q @ k.transpose(-1, -2) / math.sqrt(dim)).masked_fill(~allowed, -math.inf)
            o = (scores.softmax(-1) @ v).transpose(1, 2).flatten(-2) @ w(p + "attention.dense.weight").T
            h = h + (o + w(p + "attention.dense.bias") if c.use_bias else o)
            x = norm(h, w(p + "post_attention_layernorm.weight"), c.rms_norm_eps)
            moe = c.num_experts and i >= c.first_k_dense_replace
            h = h + (self.moe(x, p + "mlp.") if moe else swiglu(x, w, p + "mlp."))
        h = norm(h, w("model.norm.weight"), c.rms_norm_eps)
        head = w("model.word_embeddings.weight") if c.tie_word_embeddings else w("lm_head.weight")
        return MaskedLMOutput(logits=h @ head.T)
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


def write_llada2(directory: Path) -> Path:
    from dllm_decode.testing import tiny_block_diffusion

    tiny_block_diffusion("llada2").save_pretrained(directory)
    (directory / "modeling_ref.py").write_text(LLADA2_REFERENCE)
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_ref.RefConfig", "AutoModelForCausalLM": "modeling_ref.RefModel"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


WRITERS = {"llada": write_llada, "dream": write_dream, "fast_dllm": write_fast_dllm, "sdar": write_sdar,
           "llada2": write_llada2, "masked_lm": write_masked_lm}
