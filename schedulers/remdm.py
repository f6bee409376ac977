"""ReMDM: remasking discrete diffusion as inference-time scaling (Wang et al., NeurIPS 2025,
arXiv 2503.00307; `kuleshov-group/remdm`): the count form of its LLaDA port
(`guanghanwang/ReMDM-LLaDA`, as carried by ParallelBench's `remasking/llada/remdm.py`), and its
own MDLM sampler over the whole generation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dllm_decode.fields import MAX_CANVAS, bounded
from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.ops import masked_scores, tokens_per_step, topk_mask
from dllm_decode.schedulers.columns import carry
from dllm_decode.schedulers.draws import row_uniform

MODES = ("llada", "mdlm")
SCHEDULES = ("loop", "cap", "rescale", "conf")


@dataclass(frozen=True)
class ReMDMScheduler(Scheduler):
    """Low-confidence steps, then loop steps that re-mask the least confident commits and re-predict.

    Per block of B columns, the ordinary LLaDA schedule commits the most confident masks,
    `steps_per_block` steps (0: B, one token per step; the counts front-loaded as LLaDA's
    `get_num_transfer_tokens`). After ordinary step `k* = min(max(floor(insert_at * S), 1), S - 1)`
    (S the ordinary steps), `loop_steps` loop steps are inserted. Before each loop step's forward
    the `loop_number` committed block tokens with the lowest confidence at their commit are
    re-masked; the loop step then commits the `loop_number` most confident masks. A loop step
    makes no net progress, so a block takes S + `loop_steps` forwards: the rule spends a fixed
    budget of extra forwards on re-predicting the least supported tokens (quality at equal NFE,
    not speed). The last step commits every remaining mask. Every cache runs it: the re-masks
    stay inside the active block, which every step recomputes.

    Mapped onto the one-decision-per-step loop: the re-mask that precedes loop step s + 1 is
    returned by step s, together with step s's commits; a column step s would commit and also
    re-mask is simply not committed (the next forward sees the same canvas as the reference's).
    The rule declares a step budget (S + `loop_steps` per block): the loop does not clamp its
    re-masks to its commits, and does not force progress in its steps.

    Defaults: `loop_steps = 1` and `loop_number = 1` are this project's (the port asserts both are
    given and has no default); `insert_at = 7/8` is the port's. Deviations, each a fix of the
    port: the insertion index is computed from the ordinary steps, not from the block length
    (the port applies a block-length index to the step list, which means "after 7/8 of the
    tokens" only at one token per step); only committed columns of the active block are ever
    re-masked (the port's `topk` over a cache with fewer finite entries than `loop_number` picks
    masked or prompt columns and writes [MASK] over them); batch > 1; greedy or the loop's
    Gumbel sampling (the port samples from softmax(l / T)). A column may be re-masked at most
    `MAX_REVISIONS` times (loop_steps <= 4 never reaches it).

    `mode = "mdlm"` is ReMDM's own sampler (the paper's `_ddpm_caching_update`, log-linear
    schedule alpha_t = 1 - t, T = `steps` steps from t = 1 to 0, 0: the generation length, over
    the whole generation as one block). At each step, for every generated column independently:
    a committed token returns to [MASK] with probability sigma, a masked one is committed (the
    loop's candidate: argmax, or its Gumbel sample at T > 0) with probability
    (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t), so the unmasked fraction follows alpha_s for
    every sigma. Schedules: `cap` sigma = min(eta, (1 - alpha_s) / alpha_t); `rescale` sigma =
    eta min(1, (1 - alpha_s) / alpha_t); `conf` sigma_i = softmax_i(-confidence at commit) over
    the committed columns times min(1, (1 - alpha_s) / alpha_t) (sigma 0 on masked columns, so
    masks are committed at the MDLM rate and this one does not keep the marginal, as in the
    reference); `loop` (the default): MDLM to alpha_on at t_on, then alpha held at alpha_on with
    sigma = eta while t_off < t <= t_on, then MDLM to 1 (the reference's phases by t, its
    rescaled alpha_s unclamped).
    Defaults are the paper's scripts' (loop: eta 0.02, t_on 0.55, t_off 0.05, alpha_on 0.9).
    The last step (alpha_s = 1, sigma = 0) commits every mask. It takes back tokens anywhere in
    the generation, so it runs under cache `none` only. Deviations: the draws are uniform in
    float64 from `draws.row_uniform` (a batch decodes as its rows alone), not the script's
    nucleus sampling; a column is re-masked at most `MAX_REVISIONS` times; a generation with no
    mask left before step T ends there.
    """

    mode: str = "llada"
    steps_per_block: int = bounded(0, most=MAX_CANVAS, scales="memory")
    loop_steps: int = bounded(1, most=4096, scales="steps")
    loop_number: int = bounded(1, most=64, scales="steps")
    insert_at: float = 0.875
    schedule: str = "loop"
    steps: int = bounded(0, most=MAX_CANVAS, scales="memory")
    eta: float = 0.02
    t_on: float = 0.55
    t_off: float = 0.05
    alpha_on: float = 0.9

    def __post_init__(self) -> None:
        if self.steps_per_block < 0:
            raise ValueError(f"steps_per_block must be >= 0 (0: one token per step), "
                             f"got {self.steps_per_block}")
        if self.loop_steps < 0:
            raise ValueError(f"loop_steps must be >= 0, got {self.loop_steps}")
        if self.loop_number < 1:
            raise ValueError(f"loop_number must be >= 1, got {self.loop_number}")
        if not 0.0 <= self.insert_at <= 1.0:
            raise ValueError(f"insert_at must be in [0, 1], got {self.insert_at}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0 (0: the generation length), got {self.steps}")
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta must be in [0, 1], got {self.eta}")
        if not 0.0 <= self.t_off < self.t_on <= 1.0:
            raise ValueError(f"t_off and t_on must satisfy 0 <= t_off < t_on <= 1, got "
                             f"{self.t_off}, {self.t_on}")
        if not 0.0 < self.alpha_on < 1.0:
            raise ValueError(f"alpha_on must be in (0, 1), got {self.alpha_on}")

    @property
    def revises(self) -> str:                                # type: ignore[override]
        return "generated" if self.mode == "mdlm" else "block"

    @property
    def chooses_block_bounds(self) -> bool:                  # type: ignore[override]
        return self.mode == "mdlm"

    def step_budget(self, block_length: int) -> int | None:
        if self.mode == "mdlm":
            return self.steps or block_length
        return (self.steps_per_block or block_length) + self.loop_steps

    def block_end(self, inp: StepInput, state: Any) -> tuple[Tensor | None, Any]:
        return (inp.gen_span[:, 1] if self.mode == "mdlm" else None), state

    def alphas(self, k: int, steps: int) -> tuple[float, float, float | None]:
        """(alpha_t, alpha_s, sigma) at step k of `steps` (t = 1 - k/T, s = t - 1/T); sigma None
        means the schedule's own (cap, rescale, conf)."""
        t, s = 1 - k / steps, 1 - (k + 1) / steps
        if self.schedule != "loop":
            return 1 - t, 1 - s, None
        if t > self.t_on:                  # MDLM, rescaled to reach alpha_on at t_on
            scale = self.alpha_on / (1 - self.t_on)
            return (1 - t) * scale, (1 - s) * scale, 0.0
        if t <= self.t_off:                # MDLM from alpha_on to 1
            slope = (1 - self.alpha_on) / self.t_off
            return 1 - t * slope, 1 - s * slope, 0.0
        return self.alpha_on, self.alpha_on, self.eta      # the loop: alpha held, sigma = eta

    def _mdlm(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        steps = self.steps or inp.num_steps
        k = inp.step
        alpha_t, alpha_s, sigma = self.alphas(k, steps)
        bound = min(1.0, (1 - alpha_s) / alpha_t) if alpha_t > 0 else 1.0
        committed = inp.revisable if inp.revisable is not None else torch.zeros_like(inp.eligible)
        at_commit = self._at_commit(inp, state)
        if sigma is not None:
            sigmas = torch.full_like(inp.confidence, sigma, dtype=torch.float64)
        elif self.schedule == "cap":
            sigmas = torch.full_like(inp.confidence, min(self.eta, bound), dtype=torch.float64)
        elif self.schedule == "rescale":
            sigmas = torch.full_like(inp.confidence, self.eta * bound, dtype=torch.float64)
        else:                                                          # conf
            scores = torch.where(committed, -at_commit.double(), float("-inf"))
            sigmas = torch.where(committed, scores.softmax(-1), 0.0).nan_to_num(0.0) * bound
        last = k >= steps - 1 or alpha_s >= 1.0
        draws = row_uniform(inp, 2)
        if alpha_t >= 1.0:
            p_commit = torch.ones_like(sigmas)
        else:
            p_commit = ((alpha_s - (1 - sigmas) * alpha_t) / (1 - alpha_t)).clamp(0.0, 1.0)
        commit = inp.eligible & ((draws[:, 0] < p_commit) | last)
        remask = committed & (draws[:, 1] < sigmas) & (not last)
        at_commit = torch.where(commit, inp.confidence, at_commit)
        at_commit = at_commit.masked_fill(remask | ~(commit | ~inp.is_masked), float("inf"))
        return Decision(commit=commit, remask=remask), (at_commit, inp.columns.expand_as(at_commit)[:, 0])

    def plan(self, block_length: int) -> tuple[int, int]:
        """(S ordinary steps, k*: the ordinary step after which the loop steps come)."""
        ordinary = self.steps_per_block or block_length
        return ordinary, min(max(math.floor(self.insert_at * ordinary), 1), ordinary - 1)

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        if self.mode == "mdlm":
            return self._mdlm(inp, state)
        ordinary, insert = self.plan(inp.num_steps)
        k = inp.step
        in_loop = insert < k <= insert + self.loop_steps
        last = k >= ordinary - 1 + self.loop_steps
        before_loop = self.loop_steps > 0 and insert <= k < insert + self.loop_steps
        eligible = inp.eligible.sum(-1)
        if in_loop:
            count = torch.clamp(eligible, max=self.loop_number)
        else:
            done = k if k <= insert else k - self.loop_steps       # ordinary steps taken
            count = tokens_per_step(eligible, torch.full_like(eligible, max(ordinary - done, 1)))
        if last:
            count = eligible
        commit = topk_mask(inp.confidence, count)
        at_commit = self._at_commit(inp, state)
        at_commit = torch.where(commit, inp.confidence, at_commit)
        remask = torch.zeros_like(commit)
        if before_loop and not last:
            pool = inp.revisable | commit if inp.revisable is not None else commit
            picked = topk_mask(masked_scores(-at_commit, pool),
                               torch.full_like(eligible, self.loop_number))
            remask, commit = picked & ~commit, commit & ~picked
        at_commit = at_commit.masked_fill(remask | ~(commit | ~inp.is_masked), float("inf"))
        return Decision(commit=commit, remask=remask), (at_commit, inp.columns.expand_as(at_commit)[:, 0])

    def _at_commit(self, inp: StepInput, state: Any) -> Tensor:
        """(B, W) confidence at commit of the window's committed columns (+inf where unknown),
        reset at each block's first step."""
        inf = torch.full_like(inp.confidence, float("inf"))
        if state is None or inp.step == 0:
            return inf
        values, start = state
        return carry(values, start, inp.columns.expand_as(inp.confidence), float("inf"))
