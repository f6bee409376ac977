"""Draft length from the diffusion `Scheduler` interface, and HF's heuristic draft-length rule.

Each round the drafter proposes up to k tokens; they are shown to the scheduler as one denoising
step over a block of k masked positions, and the leading run of positions it commits (at least
one) is the draft that the target verifies. How the registered schedulers map:

* `threshold` (tau): stops at the first draft token whose probability is below tau, as HF's
  `assistant_confidence_threshold` (without HF's online ROC re-fit of tau).
* `low_confidence` / `random` / `margin` / `entropy` (`steps_per_block` s): commit ceil(k/s)
  positions; with `low_confidence` that is the constant draft length ceil(k/s) (s = 1: all k;
  the default s = k: one token); `random`, `margin` and `entropy` rank by their own scores, so
  their leading run varies.
* `factor` (f): the longest prefix whose n-th token has confidence >= 1 - f/(n+1).
* `eb` (gamma): the longest prefix whose draft-distribution entropies, summed less their
  maximum, stay <= gamma.
* `local_leap` (kappa, tau, radius): the leading run of tokens above kappa, or above tau within
  `radius` of one above kappa.
* `credit` (base): its base rule on credit-fused distributions; one round is one step, so the
  credit is that step's own evidence only.
* `klass` (base): KL stability needs a previous step, which a round never has, so it is always
  its base rule (default low_confidence, one token).
* `early_commit` (base): an all-in finish (large mean logit gap of the draft) verifies the
  whole draft; otherwise its base rule.
* `oracle`: its reference is aligned to a diffusion canvas, not to a round's window; with the
  default empty reference it verifies one token per round.
* any scheduler that chooses block bounds (adaptive block sizes) is rejected: an AR round has no
  block to resize (`check_scheduler`). A scheduler's `process_logits` is applied to the draft's
  distributions before `select`; tokens it would substitute are ignored (the drafter's law fixes
  the tokens); an "all-in" finish keeps the whole draft.
* `heuristic` (`HeuristicScheduler`, AR-only: in `DRAFT_LENGTHS`, not in `SCHEDULERS`): HF's
  `num_assistant_tokens_schedule="heuristic"`: +2 after a fully accepted draft, -1 otherwise.
* `bild` (`BildScheduler`, AR-only): BiLD's fallback (stop drafting below alpha_fb, at most N
  tokens) and rollback (a lenient greedy check at alpha_rb nats; not exact).
* a token tree is shown as its spine (the chain of first children): the cut keeps that many
  levels of the tree.

Confidence shown to the scheduler: the running minimum of the drafter's per-token probabilities.
A draft position is usable only if every earlier one is, so its weakest link bounds it. This is
a deviation from "the probability of each token" that changes nothing for the threshold rule
(the leading run of p_i >= tau is the same) and makes rank-based rules select a prefix, so that
`low_confidence` gives a constant length as intended.

Schedulers that subclass `DraftLengthScheduler` see one state for the whole request (reset per
request, HF's `heuristic_transient`) plus the verification outcome; every other scheduler gets a
fresh `init_state` each round, as if each round were a new block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from dllm_decode.interfaces import Scheduler, StepInput
from dllm_decode.speculative.draft_lengths import DRAFT_LENGTHS, DraftLengthScheduler
from dllm_decode.speculative.drafters.base import Draft
from dllm_decode.speculative.verify import leading_run
from dllm_decode.step import step_input


def draft_length_rule(spec: Any) -> Scheduler:
    """A draft-length rule from its name or `{"name": ..., field: value}`: an AR-only rule
    (`DRAFT_LENGTHS`, the `draft_length` registry) or any diffusion scheduler, checked with `check_scheduler`.

    Raises:
        ValueError: unknown name (the message lists both registries) or option, or a scheduler
            the AR mode cannot drive.
    """
    from dllm_decode.registry import component, registry

    if isinstance(spec, Scheduler):
        check_scheduler(spec)
        return spec
    if not isinstance(spec, (str, Mapping)):
        raise TypeError(f"a draft-length rule must be a name, a mapping with 'name' or a Scheduler, "
                        f"got {type(spec).__name__} {spec!r}")
    name = spec if isinstance(spec, str) else spec.get("name")
    if name not in DRAFT_LENGTHS and name not in registry("scheduler"):
        raise ValueError(f"unknown scheduler {name!r}; choose from "
                         f"{sorted({*DRAFT_LENGTHS, *registry('scheduler')})}")
    rule = component("draft_length" if name in DRAFT_LENGTHS else "scheduler", spec)
    check_scheduler(rule)
    return rule


def check_scheduler(scheduler: Scheduler) -> None:
    """Raise a one-line ValueError for a scheduler the AR mode cannot drive."""
    if not isinstance(scheduler, Scheduler):
        raise ValueError(f"scheduler must be a Scheduler instance, got {type(scheduler).__name__}")
    if getattr(scheduler, "chooses_block_bounds", False):
        raise ValueError(f"{type(scheduler).__name__} chooses block bounds (adaptive block "
                         f"length); a speculative round has no block to resize: pick a "
                         f"commit rule such as threshold, low_confidence or heuristic")


def draft_step_input(draft: Draft, vocab_size: int, generator: torch.Generator | None,
                     eos_ids: tuple[int, ...] = ()) -> StepInput:
    """The k drafted positions as one denoising step over a fully masked block [0, k)."""
    k = len(draft)
    probs = draft.view if draft.view is not None else torch.nn.functional.one_hot(
        draft.tokens, vocab_size).float()
    probs = probs.unsqueeze(0).float()
    confidence = draft.confidence.float().cummin(0).values.unsqueeze(0)
    return step_input(probs=probs, candidates=draft.tokens.unsqueeze(0), confidence=confidence,
                      num_steps=k, generator=generator, eos_ids=tuple(eos_ids))


def draft_length(scheduler: Scheduler, draft: Draft, state: Any, vocab_size: int,
                 width: int | None = None, generator: torch.Generator | None = None,
                 eos_ids: tuple[int, ...] = ()) -> tuple[int, Any]:
    """How many leading drafted tokens to verify (1..len(draft)), and the scheduler's new state.

    The scheduler always sees a window of `width` positions (default: the draft's length);
    positions the drafter left empty (it stopped early, hit end-of-text, or found no longer
    match) are shown as certain (confidence 1), and the answer is capped at the draft's length.
    So a draft that stopped early gets the decision the full window would have got.

    Raises:
        ValueError: an empty draft (there is nothing to schedule).
    """
    run, state = _committed_run(scheduler, draft, state, vocab_size, width, generator, eos_ids)
    return min(len(draft), max(1, run)), state


def _committed_run(scheduler: Scheduler, draft: Draft, state: Any, vocab_size: int,
                   width: int | None, generator: torch.Generator | None,
                   eos_ids: tuple[int, ...]) -> tuple[int, Any]:
    """The leading run of committed positions over the completed window (uncapped)."""
    if not len(draft):
        raise ValueError("draft_length needs at least one drafted token")
    inp = draft_step_input(_complete(draft, width or len(draft)), vocab_size, generator, eos_ids)
    processed, state = scheduler.process_logits(inp, state)
    if processed is not None:
        probs = processed.float().softmax(-1)
        picked = probs.gather(-1, inp.candidates.unsqueeze(-1)).squeeze(-1)
        inp = dataclasses.replace(inp, logits=processed.float(), probs=probs,
                                  confidence=picked.cummin(-1).values)
    decision, state = scheduler.select(inp, state)
    commit = decision.commit & inp.eligible
    if decision.finish is not None:
        commit = commit | decision.finish.unsqueeze(-1)
    return leading_run(commit[0]), state


class EarlyStop:
    """Early stop for drafters that draft token by token (HF's confidence-threshold criterion).

    Called with the draft so far; True when the scheduler, shown it completed to `width`
    positions by certain tokens (as `draft_length` shows every draft), would verify fewer tokens
    than already drafted, so drafting more is wasted. The scheduler is asked again only when the
    newest token lowers the running-minimum confidence: otherwise the window's confidences are
    those of the last question, and its answer (the committed run) stands. Exact for rules that
    read the confidences (threshold, factor, low_confidence, local_leap); for rules that read the
    distributions (margin, entropy, eb) it may stop later or earlier, which only changes draft
    lengths, never the output's exactness. Questions use a fresh state and no generator, so
    they do not move the request's random stream.
    """

    def __init__(self, scheduler: Scheduler, width: int, vocab_size: int,
                 eos_ids: tuple[int, ...] = ()):
        self.scheduler, self.width, self.vocab_size, self.eos_ids = scheduler, width, vocab_size, eos_ids
        self.floor = float("inf")
        self.run = 0

    def __call__(self, partial: Draft) -> bool:
        drafted = len(partial)
        if drafted >= self.width:
            return False
        newest = float(partial.confidence[-1])           # one host sync per drafted token
        fast = self.scheduler.continue_drafting(newest) if isinstance(
            self.scheduler, DraftLengthScheduler) else None
        if fast is not None:
            return not fast
        if newest < self.floor:
            self.floor = newest
            state = self.scheduler.init_state(1, partial.tokens.device)
            self.run, _ = _committed_run(self.scheduler, partial, state, self.vocab_size,
                                         self.width, None, self.eos_ids)
        return self.run < drafted


def _complete(draft: Draft, width: int) -> Draft:
    """`draft` padded to `width` positions with certain copies of its last token."""
    pad = width - len(draft)
    if pad <= 0:
        return draft
    tail = draft.tokens[-1:].expand(pad)
    view = draft.view
    if view is not None:
        view = torch.cat([view, torch.nn.functional.one_hot(tail, view.shape[-1]).to(view.dtype)])
    confidence = torch.cat([draft.confidence, torch.ones(pad, device=draft.confidence.device)])
    probs = draft.probs
    if probs is not None:
        probs = torch.cat([probs, torch.nn.functional.one_hot(tail, probs.shape[-1]).to(probs.dtype)])
    return Draft(torch.cat([draft.tokens, tail]), confidence, probs, view, draft.forwards)
