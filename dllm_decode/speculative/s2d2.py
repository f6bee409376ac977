"""S2D2: a block-diffusion model verifies its own diffusion drafts in its autoregressive mode.

S2D2 (Han et al., arXiv 2603.25702; code `phymhan/S2D2@279500a`, `Fast-dLLM-v2/
generate_policy_utils.py:generate_ssd_policy`, the family of the shipped `embedded-bd`). A block
model with block size 1 is autoregressive, so after each diffusion step (one forward on the block:
candidates x̂ and their probabilities p) the same weights can check the first contiguous run of
masked columns (the span) in one more forward, with the block's masks replaced by x̂ and the active
block run causally: a token-shifted model needs no [MASK] copies (its row i - 1 predicts i), as
the reference notes; an unshifted one (SDAR) gets one [MASK] copy per column (the 2L layout). A routing policy decides per step whether verifying is worth the forward;
without verification the step is the base rule's.

Two modes:

* `strict` (default, lossless): verify every step; a span column is accepted while x̂ equals the
  AR-mode argmax, and the first mismatch commits the AR-mode argmax. Every committed token is the
  block-size-1 greedy token given the committed prefix, so the decode equals
  `self_decoder.ar_mode_generate` token for token (tested). A block's first step on a token-shifted
  model commits the block start alone, by the base rule (its logit comes from the previous block,
  so it already is the AR-mode token).
* `published`: the reference's routing (`policy`) and its acceptance: column i is accepted with
  probability min(1, (q_i(x̂_i) / p_i(x̂_i))^gamma), q the AR-mode law after top-p 0.95 (the
  reference's default, applied to q even at temperature 0) and p the diffusion softmax, so
  acceptance is random even at temperature 0 (the reference's pitfall, reproduced); the first
  rejected column is committed with a token drawn from norm(max(0, q - p)) (`resample`, default);
  without resampling only the accepted prefix is committed, and when that is empty the step falls
  back to the base rule (the reference's stall guard). Uniforms and residual draws come from the request's generator, in row order
  (the reference uses the global RNG, batch 1).

Routing (`policy`): `always`; `mask_span_length` (verify iff the span has >= `min_span` columns);
`score_threshold` (verify iff score >= `score_threshold`); `score_hysteresis` (off -> on when
score > `on`, on -> off when score < `off`; per row, starting off, as the reference's `>`).
score = E[K] - penalty * n_hi (`score_type="dynamic"`, n_hi = masked block columns with p > the
base rule's threshold) or E[K] - penalty (`static`); E[K] = sum_k prod_{i<=k} alpha_i over the
span, alpha from `estimator`: `hard_margin_threshold` 1[top1 - top2 > margin] or
`soft_entropy_negexp` exp(-T H / ln V). Published defaults are the README's Fast-dLLM v2 Config-A
(hysteresis on 1, off -5, dynamic, penalty 1, the reference's default estimator
`hard_margin_threshold` with margin 0.05; base rule threshold 0.9; sub-block 4: use
`block_length=4`).

Deviations: batched (rows advance independently, per-row acceptance in a host loop over the rows
that verify); forwards recompute the canvas (no cache; the same forward count as the exact
`block` cache, `blockrun`); finished blocks keep the model's own attention pattern (the
reference's default, not `cache_ver`); [MASK] is never a draft, an accepted or a resampled token;
the contextual-bandit policy (`contextual_bandit_ucb`) is not implemented; the base rule is the
project's (`threshold` commits ties, the reference's `>` does not). Families: Fast-dLLM v2
(token-shifted, the causal forward above) and SDAR (unshifted: the reference's 2L layout, one
[MASK] copy per column at its position, `BlockRun.ar_logits`); LLaDA2 (no `verify_forward`) is
refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.config import DecodeConfig
from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import DiffusionLM
from dllm_decode.speculative.acceptance import accept_chain
from dllm_decode.speculative.blockrun import BlockRun, SpecDecode
from dllm_decode.speculative.self_decoder import SelfDecoder
from dllm_decode.step import propose

MODES = ("strict", "published")
POLICIES = ("always", "mask_span_length", "score_threshold", "score_hysteresis")
ESTIMATORS = ("hard_margin_threshold", "soft_entropy_negexp")


@dataclass(frozen=True)
class S2D2(SelfDecoder):
    """S2D2 self-speculation (see the module docstring for the rule and its deviations).

    Attributes:
        mode: `strict` (lossless w.r.t. the AR-mode greedy decode) or `published`.
        policy, min_span, score_type, penalty, score_threshold, on, off, estimator, margin,
            entropy_temperature: the published mode's routing.
        gamma: ratio tempering exponent (`ssd_ratio_tempering_factor`).
        top_p: nucleus cut applied to the verifier's law q in the published acceptance.
        resample: draw the first rejected column from the residual (else commit only the accepted
            prefix, and fall back to the base rule when it is empty).
    Raises:
        ValueError: an unknown mode, policy, score type or estimator; a count or probability out
            of range; hysteresis with on < off.
    """

    mode: str = "strict"
    policy: str = "score_hysteresis"
    min_span: int = bounded(1, most=MAX_CANVAS, scales="memory")
    score_type: str = "dynamic"
    penalty: float = 1.0
    score_threshold: float = 0.0
    on: float = 1.0
    off: float = -5.0
    estimator: str = "hard_margin_threshold"
    margin: float = 0.05
    entropy_temperature: float = 1.0
    gamma: float = 1.0
    top_p: float = 0.95
    resample: bool = True

    def __post_init__(self) -> None:
        for name, value, allowed in (("mode", self.mode, MODES), ("policy", self.policy, POLICIES),
                                     ("score_type", self.score_type, ("static", "dynamic")),
                                     ("estimator", self.estimator, ESTIMATORS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        if self.min_span < 1:
            raise ValueError(f"min_span must be >= 1, got {self.min_span}")
        if not 0 < self.top_p <= 1 or self.gamma <= 0 or self.penalty < 0 or self.margin < 0 \
                or self.entropy_temperature < 0:
            raise ValueError(f"needs top_p in (0, 1], gamma > 0 and penalty, margin, "
                             f"entropy_temperature >= 0; got {self.top_p}, {self.gamma}, "
                             f"{self.penalty}, {self.margin}, {self.entropy_temperature}")
        if self.on < self.off:
            raise ValueError(f"hysteresis needs on >= off, got on {self.on}, off {self.off}")

    @property
    def strict(self) -> bool:
        return self.mode == "strict"

    @torch.inference_mode()
    def decode(self, model: DiffusionLM, prompts: Sequence[str | Sequence[int]], config: DecodeConfig,
               generator: torch.Generator | None = None, tokenizer: Any = None) -> SpecDecode:
        run, generator = BlockRun.checked("s2d2", model, prompts, config, tokenizer, generator,
                                          verifier=True)
        mask = model.mask_token_id
        hysteresis = torch.zeros(len(run.x), dtype=torch.bool)
        verified = accepted = 0
        while not bool(run.done.all()):
            rows = run.live()
            logits = run.logits(rows)                                   # the diffusion draft
            g = run.gen_start
            _, probs, draft = propose(logits, mask)
            masked = run.masked_in_block(rows)[:, g:]
            span = _first_span(masked)
            # a token-shifted block start commits alone, unrouted (the reference's AR step)
            routed = (~_restricted(run, rows) & span.any(-1)).nonzero().squeeze(1)
            route = torch.zeros(len(rows), dtype=torch.bool, device=rows.device)
            route[routed] = self._route(run, rows[routed], probs[routed], draft[routed], masked[routed],
                                        span[routed], hysteresis)
            x = run.x[rows].clone()
            plain = (~route).nonzero().squeeze(1)
            if plain.numel():
                x[plain], _ = run.rule_step(rows[plain], logits[plain])
            check = route.nonzero().squeeze(1)
            if check.numel():
                sub = rows[check]
                filled = x[check].clone()
                fill = run.masked_in_block(sub)
                filled[:, g:] = torch.where(fill[:, g:], draft[check], filled[:, g:])
                q_logits = run.ar_logits(sub, filled)                  # the verification
                verified += len(check)
                for k, row in enumerate(check.tolist()):
                    columns = span[row].nonzero().squeeze(1)
                    tokens, n = accept_chain(draft[row, columns], probs[row, columns], q_logits[k, columns],
                                             mask, greedy=self.strict, generator=generator,
                                             gamma=self.gamma, top_p=self.top_p, resample=self.resample)
                    accepted += n
                    x[row, g + columns[:len(tokens)]] = tokens
                    if not len(tokens):   # first draft rejected, no resampling: the base rule's step
                        x[row:row + 1], _ = run.rule_step(rows[row:row + 1], logits[row:row + 1])
            run.x[rows] = x
            run.step[rows] += 1
            run.advance()
        return run.result({"verify_rounds": verified, "accepted": accepted})

    # ---- routing ------------------------------------------------------------------------
    def _route(self, run: BlockRun, rows: Tensor, probs: Tensor, draft: Tensor, masked: Tensor,
               span: Tensor, hysteresis: Tensor) -> Tensor:
        """(b,) bool: rows whose step verifies."""
        if self.strict or self.policy == "always":
            return torch.ones(len(rows), dtype=torch.bool, device=rows.device)
        if self.policy == "mask_span_length":
            return span.sum(-1) >= self.min_span
        expected = expected_tokens(self._alpha(probs), span)
        if self.score_type == "dynamic":
            threshold = float(getattr(run.config.scheduler, "threshold", 0.9))
            confident = probs.gather(-1, draft.unsqueeze(-1)).squeeze(-1) > threshold
            score = expected - self.penalty * (confident & masked).sum(-1)
        else:
            score = expected - self.penalty
        if self.policy == "score_threshold":
            return score >= self.score_threshold
        index = rows.cpu()
        now = hysteresis_step(hysteresis[index].to(score.device), score, self.on, self.off)
        hysteresis[index] = now.cpu()
        return now

    def _alpha(self, probs: Tensor) -> Tensor:
        """(b, W) the token acceptance estimate per column."""
        if self.estimator == "hard_margin_threshold":
            top = probs.topk(2, dim=-1).values
            return ((top[..., 0] - top[..., 1]) > self.margin).float()
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
        return torch.exp(-self.entropy_temperature * entropy / math.log(probs.shape[-1]))


def expected_tokens(alpha: Tensor, span: Tensor) -> Tensor:
    """(b,) E[K] = sum_k prod_{i<=k} alpha_i over each row's span (alpha (b, W), span (b, W) a
    contiguous run): the expected accepted prefix length."""
    return (torch.where(span, alpha.clamp(0, 1), torch.ones_like(alpha)).cumprod(-1) * span).sum(-1)


def hysteresis_step(was: Tensor, score: Tensor, on: float, off: float) -> Tensor:
    """(b,) routing under hysteresis: an off row turns on when score > on (the reference's `>`;
    its paper writes >=), an on row stays on unless score < off."""
    return torch.where(was, ~(score < off), score > on)


def _first_span(masked: Tensor) -> Tensor:
    """(b, W) bool: the first contiguous run of True per row."""
    first = masked.int().argmax(-1, keepdim=True)
    columns = torch.arange(masked.shape[1], device=masked.device)
    gap = (~masked) & (columns >= first)
    stop = torch.where(gap.any(-1, keepdim=True), gap.int().argmax(-1, keepdim=True), masked.shape[1])
    return masked & (columns >= first) & (columns < stop)


def _restricted(run: BlockRun, rows: Tensor) -> Tensor:
    """(b,) rows in a block's first step whose token-shifted block start commits alone."""
    from dllm_decode.models.block_grid import block_start_columns

    cols = run.columns()
    allowed = block_start_columns(run.model, run.masked_in_block(rows), cols, run.start[rows, None],
                                  run.positions[rows].gather(1, run.start[rows, None]).squeeze(1).tolist())
    if allowed is None:
        return torch.zeros(len(rows), dtype=torch.bool, device=rows.device)
    return (run.step[rows] == 0) & ~allowed.all(-1)
