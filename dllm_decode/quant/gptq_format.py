"""GPTQ int4 checkpoints as GPTQModel writes them (`quant_method: gptq`, `bits: 4`).

Per quantized linear `<m>` (K = in_features, N = out_features, G = group size):
  `qweight` int32 (K/8, N): input 8r + j of column n at bits 4j of word r;
  `qzeros` int32 (K/G, N/8): output 8c + j's zero point at bits 4j of word c; checkpoint format
      `gptq` (v1) stores z - 1 per nibble, `gptq_v2` stores z;
  `scales` float16 (K/G, N); `g_idx` int32 (K,) (the group of input k); `bias` (N,) if any.
  W[n, k] = scales[g_idx[k], n] * (q[k, n] - z[g_idx[k], n]).
The own layout (`codes.py`) holds the same q, s and z (z as one byte per group). Activation
reordering (`desc_act`) is read when `g_idx` is the plain `k // G` (the layout keeps groups
contiguous); a permuted `g_idx` is refused, as are bits other than 4.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_decode.quant.codes import SCALE_DTYPE, ZERO_DTYPE, pack_int4
from dllm_decode.quant.spec import CheckpointQuantization, QuantError, QuantSpec

FORMATS = ("gptq", "gptq_v2")


def gptq_reader(raw: dict[str, Any], where: str) -> CheckpointQuantization:
    bits = raw.get("bits")
    fmt = raw.get("checkpoint_format") or raw.get("format") or "gptq"
    if bits != 4:
        raise QuantError(f"{where}: GPTQ bits {bits!r} is not supported; accepted: 4")
    if fmt not in FORMATS:
        raise QuantError(f"{where}: GPTQ checkpoint_format {fmt!r} is not supported; accepted: "
                         f"{list(FORMATS)}")
    if raw.get("pack_dtype", "int32") != "int32":
        raise QuantError(f"{where}: GPTQ pack_dtype {raw.get('pack_dtype')!r} is not supported; "
                         f"accepted: int32")
    if raw.get("dynamic"):
        raise QuantError(f"{where}: GPTQ per-module `dynamic` overrides are not supported")
    group = raw.get("group_size", 128)
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise QuantError(f"{where}: GPTQ group_size {group!r} is not supported; accepted: a "
                         f"positive integer (one group per row, -1, is not)")
    v1 = fmt == "gptq"

    def convert(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], set[str]]:
        out: dict[str, torch.Tensor] = {}
        layers = {name[:-len(".qweight")] for name in state if name.endswith(".qweight")}
        parts = {f"{m}.{p}" for m in layers for p in ("qweight", "qzeros", "scales", "g_idx")}
        for module in layers:
            out.update(layer_codes(state, module, group, v1, where))
        out.update({k: v for k, v in state.items() if k not in parts})
        return out, layers

    spec = QuantSpec("int4", group)
    return CheckpointQuantization(spec, convert)


def unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """(R, C) int32 words -> (8 R, C) nibbles: value 8r + j from bits 4j of word r."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (words.unsqueeze(1) >> shifts[None, :, None]) & 0xF          # (R, 8, C)
    return nibbles.reshape(-1, words.shape[1])


def unpack_columns(words: torch.Tensor) -> torch.Tensor:
    """(R, C) int32 words -> (R, 8 C) nibbles: value 8c + j from bits 4j of word c."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    return ((words.unsqueeze(-1) >> shifts) & 0xF).reshape(words.shape[0], -1)


def layer_codes(state: dict[str, torch.Tensor], module: str, group: int, v1: bool,
                where: str) -> dict[str, torch.Tensor]:
    """One GPTQ layer's tensors -> `weight_q`, `weight_scale`, `weight_zero` of the own layout."""
    try:
        qweight, qzeros = state[f"{module}.qweight"], state[f"{module}.qzeros"]
        scales = state[f"{module}.scales"]
    except KeyError as err:
        raise QuantError(f"{where}: GPTQ layer {module} lacks {err.args[0]}") from None
    q = unpack_rows(qweight)                                  # (K, N) codes 0..15
    k, n = q.shape
    size = group
    g_idx = state.get(f"{module}.g_idx")
    if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(k) // size):
        raise QuantError(f"{where}: GPTQ layer {module} has a permuted g_idx (desc_act "
                         f"reordering); only contiguous groups (g_idx = k // group_size) load")
    zeros = unpack_columns(qzeros)[:, :n]                     # (K/G, N)
    if v1:
        zeros = zeros + 1                                     # v1 stores z - 1 per nibble
    s = scales.float()
    return {f"{module}.weight_q": pack_int4(q.t().contiguous()),
            f"{module}.weight_scale": s.t().to(SCALE_DTYPE).contiguous(),
            f"{module}.weight_zero": zeros.t().to(ZERO_DTYPE).contiguous()}
