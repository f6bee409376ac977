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
* `heuristic` (`HeuristicScheduler`, AR-only, so not in the diffusion `SCHEDULERS`): HF's
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
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_decode.interfaces import Decision, Scheduler, StepInput
from dllm_decode.speculative.drafters.base import Draft
from dllm_decode.speculative.verify import leading_run

_STEP_FIELDS = {f.name for f in dataclasses.fields(StepInput)}


class DraftLengthScheduler(Scheduler):
    """A scheduler that also chooses how many tokens to draft and learns from verification.

    The propose/feedback pair of HF's `CandidateGenerator` (`get_candidates` length and
    `update_candidate_strategy(..., num_matches)`), as optional hooks over the explicit state,
    plus the verification rule's lenience (BiLD's rollback).

    Class attributes:
        early_stops: a drafter that drafts token by token stops as soon as `select` (on a fresh
            state) would cut before its newest token (`EarlyStop`); off for rules whose `select`
            cuts nothing (the width already is their choice).
        cuts: `select` may verify fewer tokens than were drafted; False (the width already is
            the choice) lets the loop skip asking it each round.
    """

    early_stops: ClassVar[bool] = False
    cuts: ClassVar[bool] = True

    def propose_length(self, state: Any) -> int | None:
        """Tokens to draft this round (the loop caps it at `max_draft`), or None for the cap."""
        return None

    def feedback(self, state: Any, drafted: int, accepted: int) -> Any:
        """The target accepted `accepted` of `drafted` tokens; return the new state."""
        return state

    def lenience(self) -> float | None:
        """Nats of target cross-entropy under which a non-argmax draft token is still accepted
        by greedy verification (BiLD's rollback threshold; not exact), or None: exact."""
        return None

    def continue_drafting(self, confidence: float) -> bool | None:
        """Fast early-stop test on the newest drafted token's confidence (the spec's
        `DraftLengthPolicy.continue_drafting`, speculative-2.md §4.3): False stops drafting,
        True continues, None asks `select` (through `EarlyStop`)."""
        return None


@dataclass(frozen=True)
class HeuristicScheduler(DraftLengthScheduler):
    """HF's heuristic draft length: +`increase` after a fully accepted draft, -`decrease` otherwise.

    HF `AssistedCandidateGenerator.update_candidate_strategy` with `num_assistant_tokens_schedule=
    "heuristic"`; the state is reset per request (HF's `heuristic_transient`: HF's `heuristic`
    carries gamma across `generate` calls, which makes benchmarks depend on call order).
    Default start 5 (HF's `num_assistant_tokens` while heuristic was the default, < v4.45).
    AR-only: it needs verification feedback, which the diffusion loop has no notion of.

    Attributes:
        initial: draft length of the first round.
        increase: added after a round whose drafts were all accepted.
        decrease: removed after a round with a rejection.
        minimum: lower bound of the draft length.
        maximum: upper bound (the loop's `max_draft` caps it too).
    """

    cuts: ClassVar[bool] = False

    initial: int = 5
    increase: int = 2
    decrease: int = 1
    minimum: int = 1
    maximum: int = 64

    def __post_init__(self) -> None:
        if self.minimum < 1:
            raise ValueError(f"minimum must be >= 1, got {self.minimum}")
        if self.maximum < self.minimum:
            raise ValueError(f"maximum must be >= minimum ({self.minimum}), got {self.maximum}")
        if not self.minimum <= self.initial <= self.maximum:
            raise ValueError(f"initial must be in [{self.minimum}, {self.maximum}], got {self.initial}")
        if self.increase < 0 or self.decrease < 0:
            raise ValueError(f"increase and decrease must be >= 0, got {self.increase}, {self.decrease}")

    def init_state(self, batch_size: int, device: torch.device) -> int:
        return self.initial

    def propose_length(self, state: int) -> int:
        return state

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        return Decision(commit=inp.eligible), state          # the width already is the choice

    def feedback(self, state: int, drafted: int, accepted: int) -> int:
        step = self.increase if accepted >= drafted else -self.decrease
        return max(self.minimum, min(self.maximum, state + step))


@dataclass(frozen=True)
class BildScheduler(DraftLengthScheduler):
    """BiLD, the Big Little Decoder (Kim et al., NeurIPS 2023, arXiv 2302.07863): fallback and
    rollback policies over the small (draft) and large (target) model.

    * Fallback: the small model drafts while its probability of the token it picks stays at or
      above `fallback` (alpha_fb; for a greedy draft that is its max softmax probability, the
      reference's test), at most `max_small` (N) tokens; the first token below it is dropped and
      the large model decides that position. (The draft-length interface verifies at least one
      token: when the very first token fails it is verified anyway, which only helps.)
    * Rollback: the large model's check also keeps a small-model token that is not its argmax
      when its cross-entropy -log p_L(y) is at most `rollback` nats (alpha_rb), and rolls back
      from the first token above it, emitting the large model's token there. Checked at every
      position (the reference checks only the first above-threshold one, spec speculative-2.md
      §1.3-1.5). Not exact: a speed/quality knob; greedy only, as the reference.
      `rollback=None` is exact verification with BiLD's stop rule ("BiLD-stop", §1.6).

    Defaults are the reference code's (0.6, 5.0, 10); 0 means 0 here (the reference silently
    replaces a 0 threshold by its default). Stateless.

    Attributes:
        fallback: alpha_fb in [0, 1].
        rollback: alpha_rb >= 0 in nats, or None (exact).
        max_small: N, most consecutive small-model tokens per round.
    """

    fallback: float = 0.6
    rollback: float | None = 5.0
    max_small: int = 10
    early_stops: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.fallback <= 1.0:
            raise ValueError(f"fallback must be in [0, 1], got {self.fallback}")
        if self.rollback is not None and not 0.0 <= self.rollback <= 100.0:
            raise ValueError(f"rollback must be in [0, 100] nats or None, got {self.rollback}")
        if not 1 <= self.max_small <= 256:
            raise ValueError(f"max_small must be in [1, 256], got {self.max_small}")

    def propose_length(self, state: Any) -> int:
        return self.max_small

    def select(self, inp: StepInput, state: Any) -> tuple[Decision, Any]:
        # `confidence` is the running minimum of the draft's probabilities: a leading run.
        return Decision(commit=inp.eligible & (inp.confidence >= self.fallback)), state

    def lenience(self) -> float | None:
        return self.rollback

    def continue_drafting(self, confidence: float) -> bool:
        return confidence >= self.fallback


SPEC_SCHEDULERS: dict[str, type[Scheduler]] = {
    "heuristic": HeuristicScheduler,    # HF assisted generation, +2 / -1 (AR-only)
    "bild": BildScheduler,              # BiLD fallback + rollback (Kim et al. 2023; lossy rollback)
}


def draft_length_rule(spec: Any) -> Scheduler:
    """A draft-length rule from its name or `{"name": ..., field: value}`: an AR-only rule
    (`SPEC_SCHEDULERS`) or any diffusion scheduler, checked with `check_scheduler`.

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
    if name not in SPEC_SCHEDULERS and name not in registry("scheduler"):
        raise ValueError(f"unknown scheduler {name!r}; choose from "
                         f"{sorted({*SPEC_SCHEDULERS, *registry('scheduler')})}")
    rule = component("draft_length" if name in SPEC_SCHEDULERS else "scheduler", spec)
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
    device = draft.tokens.device
    probs = draft.view if draft.view is not None else torch.nn.functional.one_hot(
        draft.tokens, vocab_size).float()
    probs = probs.unsqueeze(0).float()
    every = torch.ones(1, k, dtype=torch.bool, device=device)
    confidence = draft.confidence.float().cummin(0).values.unsqueeze(0)
    span = torch.tensor([[0, k]], device=device)
    extra = {"eos_ids": tuple(eos_ids)} if "eos_ids" in _STEP_FIELDS else {}
    return StepInput(step=0, num_steps=k, offset=0, block=span, gen_span=span, is_masked=every,
                     eligible=every, candidates=draft.tokens.unsqueeze(0), confidence=confidence,
                     probs=probs, logits=probs.clamp_min(1e-30).log(), live=every.any(-1),
                     generator=generator, **extra)


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
