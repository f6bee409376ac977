"""GPTQ int4 codes from a layer's input Hessian (Frantar et al., arXiv 2210.17323; reference
code IST-DASLab/gptq `gptq.py` `GPTQ.fasterquant`).

The columns of W are quantized one at a time in input order; each column's rounding error is
spread over the not-yet-quantized columns through the inverse Hessian's Cholesky factor, so the
layer's output on the calibration inputs, not the weight itself, stays close. As the reference:
damping 1% of the Hessian's mean diagonal, lazy batch updates in blocks of 128 columns, a group's
scale and zero chosen (min/max) from the updated weights when quantization reaches its first
column (`static_groups=False`), dead inputs (zero diagonal) zeroed.

The grid is the reference quantizer's (`codes.py`: asymmetric min/max, integer zero point).
Deviation: the Hessians of all layers are gathered in one
pass over the float model rather than layer by layer from the quantized predecessors' outputs
(`true_sequential`), which keeps the gathering to one set of decodes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dllm_decode.quant.codes import ZERO_DTYPE, Codes, int4_codes, int4_params, pack_int4

DAMP = 0.01
BLOCK = 128


def gptq_int4(weight: Tensor, hessian: Tensor, group_size: int, damp: float = DAMP,
              block: int = BLOCK) -> Codes:
    """int4 codes of a (N, K) weight minimising the output error on inputs with Hessian
    `hessian` (K, K) = sum of x x^T (any positive scale)."""
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    n, k = w.shape
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += damp * torch.mean(torch.diag(h)) * torch.eye(k, device=h.device)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    groups = k // group_size
    scale = torch.empty(n, groups, dtype=torch.float16, device=w.device)
    zero = torch.empty(n, groups, dtype=ZERO_DTYPE, device=w.device)
    codes = torch.empty(n, k, dtype=torch.int32, device=w.device)
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        hinv1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:
                g = col // group_size
                # the reference reads the outer W here: updated by the earlier blocks only
                s, z = int4_params(w[:, col:col + group_size], group_size)
                scale[:, g], zero[:, g] = s[:, 0], z[:, 0]
            g = col // group_size
            q = int4_codes(w1[:, i:i + 1], scale[:, g:g + 1], zero[:, g:g + 1])
            codes[:, col] = q[:, 0]
            deq = (q[:, 0].float() - zero[:, g].float()) * scale[:, g].float()
            err = (w1[:, i] - deq) / hinv1[i, i]
            w1[:, i:] -= err.unsqueeze(1) @ hinv1[i, i:].unsqueeze(0)
            err1[:, i] = err
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    return Codes(pack_int4(codes), scale, zero)
