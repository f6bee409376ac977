"""Multi-block pipelined decoding, D2F-style, on full-attention models (d3LLM, arXiv 2601.07568;
code `hao-ai-lab/d3LLM@e5bfcac: d3llm/d3llm_LLaDA/d3llm_llada_generate_util.py`,
`generate_multi_block`; SGLang's `FullAttnMultiBlock` port)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import argmax_mask, masked_scores, neg_entropy


@dataclass(frozen=True)
class MultiBlockScheduler(Scheduler):
    """Decode several sub-blocks at once: the next one joins while its predecessor is still filling.

    The loop's block is the whole pipelined region (`block_end` at step 0: the generation end, or
    `max_blocks` sub-blocks); `DecodeConfig.block_length` is not used. The region is cut into
    sub-blocks of `sub_block` columns; progress(k) = 1 - masks(k) / size(k), and the prompt counts
    as a complete sub-block before the first. Each step, from the canvas as the previous step left
    it: (1) an added sub-block becomes fully active once its predecessor's progress is
    >= `activate_threshold`; (2) when the last added sub-block's progress is >= `add_threshold`
    (or it has no mask), the next one is added (fully active at once if its predecessor passes the
    activation bar); (3) the eligible columns are the masked ones of the added sub-blocks (semi-
    active ones included); commit those with entropy H <= `threshold` nats (ties pass), plus the
    lowest-entropy eligible column (`global_min`, d3LLM), plus, if the first fully active sub-block
    that still has masks got no commit, its lowest-entropy column (forced progress; alone, with
    `global_min=False`, this is the SGLang port).

    Defaults: threshold 0.5 (d3LLM-LLaDA's command; SGLang uses 0.4), sub_block 32, add 0.1 and
    activate 0.95 (the evaluation wrapper's values, which every published command uses; the
    function's own defaults are 0.5 / 0.5). With add = activate = 1.0 and one sub-block per
    `block_length`, sub-blocks run strictly one after another and the rule is `entropy_threshold`
    at the same bar and block length.

    Caches: under `none` the rule is exact. Under `prefix` and `dual` the one phase per region
    caches only the prompt, once, and a bidirectional model's prompt K/V go stale as the region
    fills: approximate (`max_blocks` bounds the region so the prefix cache refreshes at each
    region; the next region starts only when this one is done, unlike Diffulex's sliding
    buffer). d3LLM's delayed prefix cache (`cache_delay_iter`, `refresh_interval`) is not
    implemented; block-diffusion models (`block` cache, a block grid) refuse rules that move block
    ends. Deviations: entropy in float32 from the loop's softmax, [MASK] excluded (d3LLM: float64,
    log(p + 1e-12)); ties in the lowest entropy go to the lowest column; EOS handling is the
    `eotp` filter's (d3LLM's `early_stop`), since the loop's `stop_at_eos` acts only at the region
    end. Diffulex's confidence-scored variant is not offered. Batched with per-row activation.
    """

    chooses_block_bounds = True

    threshold: float = 0.5
    sub_block: int = bounded(32, most=MAX_CANVAS, scales="memory")
    add_threshold: float = 0.1
    activate_threshold: float = 0.95
    max_blocks: int = bounded(0, most=MAX_CANVAS, scales="memory")
    global_min: bool = True
    infinite_ok = ("threshold",)

    def __post_init__(self) -> None:
        if math.isnan(self.threshold) or self.threshold < 0.0:
            raise ValueError(f"threshold must be in [0, inf] nats, got {self.threshold}")
        if self.sub_block < 1:
            raise ValueError(f"sub_block must be >= 1, got {self.sub_block}")
        for name in ("add_threshold", "activate_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.max_blocks < 0:
            raise ValueError(f"max_blocks must be >= 0 (0: the whole generation), got {self.max_blocks}")

    def check_config(self, config: Any) -> None:
        # sub-blocks tile the region: one that does not divide the canvas leaves a ragged last one
        if self.sub_block < config.gen_length and config.gen_length % self.sub_block:
            raise ValueError(f"{type(self).__name__}.sub_block ({self.sub_block}) must divide gen_length ({config.gen_length}) "
                             f"or cover it")

    def block_end(self, inp: StepInput, state: Any) -> tuple[Tensor | None, Any]:
        end = inp.gen_span[:, 1]
        if self.max_blocks:
            end = torch.minimum(end, inp.block[:, 0] + self.max_blocks * self.sub_block)
        return end, state

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        batch = inp.live.shape[0]
        n = max(1, -(-inp.num_steps // self.sub_block))
        device = inp.live.device
        if inp.step == 0 or state is None or state["added"].shape[1] != n:
            first = torch.zeros(batch, n, dtype=torch.bool, device=device)
            first[:, 0] = True
            state = {"added": first, "active": first}
        offset = inp.columns - inp.block[:, :1]
        in_region = (offset >= 0) & (inp.columns < inp.block[:, 1:])
        sub = (offset // self.sub_block).clamp(0, n - 1)
        masks = torch.zeros(batch, n, device=device).scatter_add(1, sub, (inp.is_masked & in_region).float())
        size = torch.zeros(batch, n, device=device).scatter_add(1, sub, in_region.float())
        exists = size > 0
        progress = torch.where(exists, 1 - masks / size.clamp_min(1), 1.0)
        before = torch.cat([torch.ones(batch, 1, device=device), progress[:, :-1]], 1)   # the prompt: 1.0
        added, active = state["added"], state["active"]
        active = active | (added & (before >= self.activate_threshold))
        last = added.long().sum(-1) - 1                                              # added is a prefix
        last_progress = progress.gather(1, last.unsqueeze(-1)).squeeze(-1)
        last_masks = masks.gather(1, last.unsqueeze(-1)).squeeze(-1)
        grow = (last_progress >= self.add_threshold) | (last_masks == 0)
        index = torch.arange(n, device=device)
        joining = grow.unsqueeze(-1) & (index == (last + 1).unsqueeze(-1)) & exists
        added = added | joining
        active = active | (joining & (last_progress >= self.activate_threshold).unsqueeze(-1))

        eligible = inp.eligible & added.gather(1, sub)
        entropy = -neg_entropy(inp.probs)
        lowest = masked_scores(-entropy, eligible)
        commit = eligible & (entropy <= self.threshold)
        if self.global_min:
            commit = commit | argmax_mask(lowest)
        open_active = active & (masks > 0)
        first_open = open_active.long().argmax(-1, keepdim=True)                      # first True
        in_first = eligible & (sub == first_open) & open_active.any(-1, keepdim=True)
        starved = ~(commit & in_first).any(-1, keepdim=True)
        commit = commit | (argmax_mask(masked_scores(-entropy, in_first)) & starved)
        return Decision(commit=commit), {"added": added, "active": active}
