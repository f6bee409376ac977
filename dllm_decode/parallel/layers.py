"""The modules a tensor-parallel model is made of, each holding this rank's slice of a weight
and issuing its own collectives explicitly (functional collectives, `parallel.collectives`).

  * `RowParallelLinear`: o and down. The input's last dim is this rank's slice of heads / MLP
    columns; the partial products are summed by one all_reduce. A bias is held by TP rank 0 only
    (zeros elsewhere), so the sum adds it once.
  * `VocabParallelEmbedding`: rows [start, start + n) of the (padded) vocabulary; ids outside
    the slice give zero rows; one all_reduce sums the ranks. Exact: every position gets one
    rank's row plus zeros.
  * `VocabParallelHead`: the head's rows for the same vocabulary slice; one all_gather of the
    local logits of the rows the forward asks for (the loop's active window: every model here
    slices its hidden states to the window before the head), then the vocabulary padding is cut.

Column-parallel q|k|v and gate|up need no module: they are `nn.Linear`s with this rank's rows
(and no collective). All three subclass what they replace and keep its parameter names, so a
sharded model's `state_dict` names equal the checkpoint's, and the compact runtime fuses the
local weights exactly as it fuses whole ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_decode.parallel.collectives import all_gather_last, all_reduce, all_reduce_max


class RowParallelLinear(nn.Linear):
    """`nn.Linear` over this rank's input columns, then the all_reduce of the partial outputs."""

    def __init__(self, in_local: int, out_features: int, bias: bool, group_name: str | None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__(in_local, out_features, bias=bias, device=device, dtype=dtype)
        self.group_name = group_name

    def forward(self, x: Tensor) -> Tensor:
        return all_reduce(F.linear(x, self.weight, self.bias), self.group_name)

    def reduce(self, x: Tensor) -> Tensor:
        """The all_reduce alone (the compact runtime multiplies the fused weights itself)."""
        return all_reduce(x, self.group_name)

    def row_max(self, x: Tensor) -> Tensor:
        """Elementwise max over the ranks: a per-output-channel quantization scale spans the
        whole row, so a rank's shard gets the codes the whole matrix would (`dllm_decode.quant`)."""
        return all_reduce_max(x, self.group_name)


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + weight.shape[0]) of the embedding; the others come from other ranks."""

    def __init__(self, rows: int, dim: int, start: int, group_name: str | None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, dim, device=device, dtype=dtype))
        self.start, self.group_name = start, group_name

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        return all_reduce(torch.where(inside.unsqueeze(-1), rows, rows.new_zeros(())), self.group_name)


class VocabParallelHead(nn.Module):
    """The head's rows for this rank's vocabulary slice, all-gathered to (..., vocab_size).

    Args:
        rows: local rows (the padded vocabulary / tp).
        vocab_size: the real vocabulary; the gathered padding columns past it are cut.
        tied: the `VocabParallelEmbedding` whose weight the head shares (tied checkpoints), or
            None for a head of its own (`weight`, `bias` parameters, under the head's names).
    """

    def __init__(self, rows: int, dim: int, vocab_size: int, tp: int, group_name: str | None,
                 bias: bool = False, tied: VocabParallelEmbedding | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.vocab_size, self.tp, self.group_name = vocab_size, tp, group_name
        self._tied = [tied] if tied is not None else []          # a list: not a submodule
        if tied is None:
            self.weight = nn.Parameter(torch.empty(rows, dim, device=device, dtype=dtype))
            self.bias = nn.Parameter(torch.empty(rows, device=device, dtype=dtype)) if bias else None

    def local_weight(self) -> Tensor:
        return self._tied[0].weight if self._tied else self.weight

    def forward(self, h: Tensor) -> Tensor:
        local = F.linear(h, self.local_weight(), None if self._tied else self.bias)
        return all_gather_last(local, self.tp, self.group_name)[..., :self.vocab_size]
