"""PSD: multi-depth drafts from one forward's confidences, verified in one batched forward.

PSD, parallel speculative decoding for dLLMs (Sun, Li, Liu, ... Ma, arXiv 2605.15609; no code
public, so the rule below is RECONSTRUCTED from the abstract): "Using the confidence scores from a
single forward pass, PSD selects positions to unmask via a configurable, adaptive unmasking policy
and constructs multi-depth speculative drafts without extra model calls. A final batched
verification pass then applies hierarchical acceptance, keeping the deepest draft that remains
consistent with the updated predictions."

From the current canvas x_0 and its fresh logits l_0, the base rule (any deterministic stateless
project rule: the "adaptive unmasking policy") is applied `draft_steps` = K times to the same stale
logits, giving nested drafts d_1 ⊂ ... ⊂ d_K inside the active block (d_1 is exact: its logits are
fresh); one forward over the K drafts of every row (the batch's drafts together) gives each its
fresh logits l_j. Acceptance, walking down the depths:

* `strict` (lossless; the chain check of `dllm_decode.speculative.selfspec`): d_{j+1} is accepted
  while the rule applied to d_j with l_j gives exactly d_{j+1}. The decode equals `generate` with
  the same rule token for token (tested), with at most as many forwards.
* `lenient` (RECONSTRUCTED reading of "consistent with the updated predictions"): d_{j+1} is
  accepted while every token it adds to d_j equals the argmax of l_j at its column (the tokens
  agree; which columns the rule would pick may differ). Not lossless.

The accepted draft's logits are the next round's l_0, so every forward both verifies and drafts.
Reconstructed parts (no paper method section or code read): the drafting by stale logits, both
acceptance rules, and confining drafts to the active block. Deviations from the project's
`selfspec.py` (batch 1): batched (rows advance independently; their drafts share the one verify
forward), no side leaves (`branch`). Forwards recompute the canvas (no cache, `blockrun`);
`forward_rows` counts each verified draft (K rows per verify forward): fewer forwards buy
wall-clock only where a K-row forward costs less than K single ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.fields import bounded
from dllm_decode.interfaces import DiffusionLM
from dllm_decode.speculative.blockrun import BlockRun, SpecDecode
from dllm_decode.speculative.self_decoder import SelfDecoder
from dllm_decode.step import propose

ACCEPTANCE = ("strict", "lenient")


@dataclass(frozen=True)
class PSD(SelfDecoder):
    """PSD self-speculation (see the module docstring).

    Attributes:
        draft_steps: K, the draft depths built from one forward (1: the stepwise decoder).
        acceptance: `strict` (lossless w.r.t. `generate` with the base rule) or `lenient`.
    Raises:
        ValueError: K outside [1, 64] or an unknown acceptance.
    """

    needs_verifier: ClassVar[bool] = False
    strict_base: ClassVar[str] = "generate"

    draft_steps: int = bounded(4, most=64, scales="rows")
    acceptance: str = "strict"

    def __post_init__(self) -> None:
        if not 1 <= self.draft_steps <= 64:
            raise ValueError(f"draft_steps must be in [1, 64], got {self.draft_steps}")
        if self.acceptance not in ACCEPTANCE:
            raise ValueError(f"acceptance must be one of {list(ACCEPTANCE)}, got {self.acceptance!r}")

    @property
    def strict(self) -> bool:
        return self.acceptance == "strict"

    @torch.inference_mode()
    def decode(self, model: DiffusionLM, prompts: Sequence[str | Sequence[int]], config: DecodeConfig,
               generator: torch.Generator | None = None, tokenizer: Any = None) -> SpecDecode:
        run, _ = BlockRun.checked("psd", model, prompts, config, tokenizer, generator, verifier=False)
        everyone = run.live()
        fresh = run.logits(everyone)                          # (B, W - g, V) logits of each row's x
        accepted: list[int] = []
        while not bool(run.done.all()):
            rows = run.live()
            drafts, final = self._drafts(run, rows, fresh[rows])          # (b, K, W), (b, K) bool
            depth = drafts.shape[1]
            need = ~final                                                  # drafts that need logits
            owners = rows[:, None].expand(-1, depth)[need]
            out = None
            if bool(need.any()):
                out = run.logits(owners, drafts[need], verify=True)       # the verify forward
            index = torch.full(need.shape, -1, dtype=torch.long, device=need.device)
            index[need] = torch.arange(int(need.sum()), device=need.device)
            best = self._walk(run, rows, drafts, out, index)
            pick = torch.arange(len(rows), device=rows.device)
            run.x[rows] = drafts[pick, best - 1]
            run.step[rows] += best
            accepted.extend(best.tolist())
            keep = index[pick, best - 1]
            has = keep >= 0
            if bool(has.any()):
                fresh[rows[has]] = out[keep[has]]
            ended = _block_full(run, rows) & ~has
            run.advance()
            if bool(ended.any()):          # a final draft accepted: its row must have finished
                assert bool(run.done[rows[ended]].all())
        return run.result({"advanced": accepted})

    def _drafts(self, run: BlockRun, rows: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """(b, K, W) nested drafts from stale `logits`, padded by repeating a row's last draft
        once its block is full, and (b, K) whether a draft needs no logits (the decode of its row
        ends with it, or it repeats an earlier draft)."""
        mask = run.model.mask_token_id
        x = run.x[rows]
        out, final = [], []
        done = torch.zeros(len(rows), dtype=torch.bool, device=x.device)
        for j in range(self.draft_steps):
            nxt, _ = run.rule_step(rows, logits, x, steps=run.step[rows] + j)
            nxt = torch.where(done[:, None], x, nxt)
            full = ~(run.in_block(rows) & (nxt == mask)).any(-1)
            ends = full & (_last_block(run, rows) | _eos_block(run, rows, nxt))
            out.append(nxt)
            final.append(done | ends)
            done = done | full
            x = nxt
        return torch.stack(out, 1), torch.stack(final, 1)

    def _walk(self, run: BlockRun, rows: Tensor, drafts: Tensor, out: Tensor | None,
              index: Tensor) -> Tensor:
        """(b,) accepted depth per row (>= 1: the first draft is exact)."""
        best = torch.ones(len(rows), dtype=torch.long, device=rows.device)
        going = index[:, 0] >= 0
        for j in range(1, drafts.shape[1]):
            if not bool(going.any()):
                break
            live = going.nonzero().squeeze(1)
            logits = out[index[live, j - 1]]
            prev, nxt = drafts[live, j - 1], drafts[live, j]
            if self.strict:
                successor, _ = run.rule_step(rows[live], logits, prev, steps=run.step[rows[live]] + j)
                ok = (successor == nxt).all(-1)
            else:
                _, _, top = propose(logits, run.model.mask_token_id)
                added = (nxt != prev)[:, run.gen_start:]
                ok = ((top == nxt[:, run.gen_start:]) | ~added).all(-1)
            ok = ok & (nxt != prev).any(-1)                                # a padding repeat stops
            best[live[ok]] += 1
            going = torch.zeros_like(going)
            going[live[ok]] = index[live[ok], j] >= 0
        return best


def _last_block(run: BlockRun, rows: Tensor) -> Tensor:
    return run.end[rows] >= run.gen_end[rows]


def _eos_block(run: BlockRun, rows: Tensor, x: Tensor) -> Tensor:
    if not run.config.stop_at_eos:
        return torch.zeros(len(rows), dtype=torch.bool, device=x.device)
    eos = torch.tensor(tuple(run.model.eos_token_ids), device=x.device)
    return (run.in_block(rows) & torch.isin(x, eos)).any(-1)


def _block_full(run: BlockRun, rows: Tensor) -> Tensor:
    return ~run.masked_in_block(rows).any(-1)
