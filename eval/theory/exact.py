"""The ideal model's exact accuracy and speed under a scheduler, by enumerating its denoising chain
with the scheduler's own rule (ParallelBench, Kang et al., 2025, arXiv 2510.04767, §4.2).

Shuffle and Replace Random on a canvas of exactly the n answer positions (one block). At every
step all masked positions have the same marginal under the ideal model (`ideal.py`), so the
decoding is a Markov chain over a few numbers:

* Replace Random. `open(m)`: the new word is unplaced and m positions are masked; each one's
  marginal is the word with 1/m, its own item with (m-1)/m. `placed(m)`: the word was committed
  once; every marginal is one-hot (solved). `broken(m)`: the word was committed twice or more; no
  answer agrees with the canvas, so each marginal is the mean over all n answers (word 1/n; failed).
  `open(0)` means every position kept its item (failed).
* Shuffle. `open(m)`: m items unplaced, each masked position uniform over them. `broken(m, L)`:
  an item was committed twice, L > m items are unplaced, each masked position uniform over them.

Positions draw their tokens independently (greedy ties split evenly: the eval decoder's logit
noise breaks them at random). Which drawn positions a step commits is asked of the scheduler
itself: the engine builds the step's `StepInput` for every arrangement of the draws and calls
`select`, so no rule is written twice. Averaging over all arrangements also makes any position-
based tie-break (the stable sort's lowest column) equal to the decoder's random one. Shuffle's
confidences do not depend on which item a position drew, so one row gives the step's count and
the number of distinct items among the committed draws does the rest.

Only rules that look at nothing but the current step's per-position scores qualify (`EXACT_RULES`);
rules with memory (KLASS, credit), neighbourhoods (local_leap) or block moves have no such chain.

Knife edges: the eval decoder adds small noise to the ideal model's logits, so a rule that compares
a confidence (or an entropy sum) within `EDGE` of its bar, e.g. threshold 0.5 against Shuffle's
1/2, or factor 1 at n = 4 (3/4 against 1 - 1/4), is decided by that noise, not by the exact
values. Every step is therefore also asked with confidences scaled by 1 +- `EDGE` and marginals
sharpened or flattened by that much; when the decision moves, `KnifeEdge` is raised instead of
returning a number the decoder will not reproduce.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from dllm_decode.interfaces import Scheduler
from dllm_decode.registry import name_of
from dllm_decode.step import step_input

EXACT_RULES = frozenset({"low_confidence", "random", "margin", "entropy", "threshold", "factor", "eb"})
"""Registered schedulers whose step depends only on the step's per-position scores and counts."""
CHANCE_RANKED = frozenset({"random"})
"""Rules that rank positions by their own uniform draws, independent of the sampled tokens: the
engine takes their count from one row and the committed tokens' make-up from the binomial."""
EXACT_TASKS = ("shuffle", "replace_random")

EDGE = 0.01
"""Relative perturbation a decision must survive (the decoder's logit noise is ~1e-3)."""

Outcomes = dict[tuple[bool, int], float]
"""(solved, forward passes) -> probability."""


class KnifeEdge(ValueError):
    """A step's decision flips under a perturbation of `EDGE`: the decoder's noise decides it."""


@dataclass(frozen=True)
class Outcome:
    """The ideal model's expected result under one decoding setting.

    Attributes:
        accuracy: chance (0-1) that the decoded answer is a valid answer of the data model
            (Shuffle: any permutation, the identity included).
        tokens_per_step: E[n / NFE], the mean answer tokens per forward pass (the canvas is the
            n answer positions, so also ParallelBench's tokens per step).
        steps: E[NFE].
    """

    accuracy: float
    tokens_per_step: float
    steps: float


def draw_probability(p: float, temperature: float) -> float:
    """Chance that a position whose marginal gives one token p and another 1 - p draws the first:
    softmax(log p / T) over the two (Gumbel sampling at temperature T); greedy (T = 0) takes the
    larger and splits a tie evenly."""
    if p <= 0.0 or p >= 1.0:
        return min(max(p, 0.0), 1.0)
    if temperature == 0:
        return 1.0 if p > 0.5 else 0.5 if p == 0.5 else 0.0
    return 1.0 / (1.0 + math.exp((math.log1p(-p) - math.log(p)) / temperature))


def commits(scheduler: Scheduler, probs: torch.Tensor, candidates: torch.Tensor, step: int,
            num_steps: int, confidence: torch.Tensor | None = None) -> torch.Tensor:
    """(B, m) bool: what `scheduler` commits at block step `step` when every one of the m
    positions is masked and eligible, with per-position marginals `probs` (B, m, V) and drawn
    `candidates` (B, m), under the loop's rules (`Decision.resolve`: at least one per row).
    `confidence` overrides the candidates' probabilities (the knife-edge check)."""
    batch, _, vocab = probs.shape
    inp = step_input(probs=probs, candidates=candidates, confidence=confidence, step=step,
                     num_steps=num_steps, generator=torch.Generator().manual_seed(0), mask_id=vocab)
    decision, _ = scheduler.select(inp, scheduler.init_state(batch, torch.device("cpu")))
    return decision.resolve(inp)[0]


def decided_commits(scheduler: Scheduler, probs: torch.Tensor, candidates: torch.Tensor,
                    step: int, num_steps: int, greedy: bool = False) -> torch.Tensor:
    """`commits`, checked to hold when the uncertain confidences move by +-`EDGE` (relative) and
    the marginals are sharpened or flattened by that much (probs ** (1 +- EDGE), renormalised).
    Greedy decoding picks the noisy argmax, so a candidate tied for the top can only gain
    confidence from the noise: it is not moved down.

    Raises:
        KnifeEdge: the decision moves, so the decoder's logit noise decides it.
    """
    base = commits(scheduler, probs, candidates, step, num_steps)
    confidence = probs.gather(-1, candidates.unsqueeze(-1)).squeeze(-1)
    uncertain = (confidence > 0) & (confidence < 1)     # exact 0/1 stay exact under the noise
    top = probs.max(-1).values
    tied_top = (confidence == top) & ((probs == top.unsqueeze(-1)).sum(-1) > 1)
    for factor in (1 + EDGE, 1 - EDGE):
        movable = uncertain & ~(tied_top & greedy) if factor < 1 else uncertain
        moved = torch.where(movable, confidence * factor, confidence)
        powered = probs ** factor
        powered = powered / powered.sum(-1, keepdim=True)
        if not (torch.equal(commits(scheduler, probs, candidates, step, num_steps, moved), base)
                and torch.equal(commits(scheduler, powered, candidates, step, num_steps), base)):
            raise KnifeEdge(f"{name_of(scheduler)} compares a confidence within {EDGE:.0%} of its "
                            f"bar at step {step} ({probs.shape[1]} positions masked): the decoder's "
                            f"logit noise decides it")
    return base


def fixed_partition(scheduler: Scheduler, n: int) -> tuple[int, ...]:
    """Positions committed per step over a block of n by a rule whose counts ignore the scores
    (`low_confidence`, `random`, `margin`, `entropy`): asked of the rule itself, step by step."""
    sizes, left = [], n
    while left:
        uniform = torch.full((1, left, 2), 0.5)
        size = int(commits(scheduler, uniform, torch.zeros(1, left, dtype=torch.long),
                           len(sizes), n).sum())
        sizes.append(size)
        left -= size
    return tuple(sizes)


def exact_outcome(task: str, n: int, scheduler: Scheduler, temperature: float) -> Outcome:
    """The ideal model's exact accuracy and speed for `task` with n items, decoded in one block of
    n positions by `scheduler` at `temperature` (see the module docstring).

    Raises:
        ValueError: a task other than Shuffle / Replace Random, n < 1, a negative temperature, or
            a scheduler outside `EXACT_RULES`; `KnifeEdge` (a ValueError) when a decision on the
            way is decided by the decoder's logit noise.
    """
    name = name_of(scheduler)
    if task not in EXACT_TASKS:
        raise ValueError(f"no exact ideal-model chain for task {task!r}; choose from {EXACT_TASKS}")
    if name not in EXACT_RULES:
        raise ValueError(f"scheduler {name!r} has memory or position-dependent rules; the exact "
                         f"chain covers {sorted(EXACT_RULES)}")
    if n < 1 or temperature < 0:
        raise ValueError(f"need n >= 1 and temperature >= 0, got n={n}, temperature={temperature}")
    return _summarize(_chain(task, n, scheduler, float(temperature)), n)


@functools.lru_cache(maxsize=512)
def _chain(task: str, n: int, scheduler: Scheduler, temperature: float) -> tuple:
    step_of = _replace_random_step if task == "replace_random" else _shuffle_step
    memo: dict[Hashable, Outcomes] = {}

    def outcomes(state: tuple, step: int) -> Outcomes:
        kind, m = state[0], state[1]
        if m == 0:
            solved = kind == "placed" or (task == "shuffle" and kind == "open")
            return {(solved, 0): 1.0}
        if (state, step) not in memo:
            out: Outcomes = defaultdict(float)
            for chance, after in step_of(state, step, n, scheduler, temperature):
                for (solved, steps), p in outcomes(after, step + 1).items():
                    out[solved, steps + 1] += chance * p
            memo[state, step] = dict(out)
        return memo[state, step]

    return tuple(sorted(outcomes(("open", n), 0).items()))


def _summarize(outcomes: tuple, n: int) -> Outcome:
    return Outcome(accuracy=sum(p for (solved, _), p in outcomes if solved),
                   tokens_per_step=sum(p * n / steps for (_, steps), p in outcomes),
                   steps=sum(p * steps for (_, steps), p in outcomes))


def _replace_random_step(state: tuple, step: int, n: int, scheduler: Scheduler,
                         temperature: float) -> list[tuple[float, tuple]]:
    kind, m = state
    p_word = {"open": 1.0 / m, "placed": 0.0, "broken": 1.0 / n}[kind]
    q = draw_probability(p_word, temperature)
    split: dict[tuple[int, int], float] = defaultdict(float)      # (keeps, words) committed
    if name_of(scheduler) in CHANCE_RANKED:
        count = int(commits(scheduler, _two_token_rows(p_word, torch.zeros(1, m, dtype=torch.bool)),
                            torch.zeros(1, m, dtype=torch.long), step, n).sum())
        for words in range(count + 1):
            split[count - words, words] += math.comb(count, words) * q ** words * (1 - q) ** (count - words)
    else:
        patterns = _word_patterns(m, q)
        drawn = _two_token_rows(p_word, patterns)
        chosen = decided_commits(scheduler, drawn, patterns.long(), step, n, temperature == 0)
        words = (chosen & patterns).sum(-1).tolist()
        keeps = (chosen & ~patterns).sum(-1).tolist()
        count = patterns.sum(-1).tolist()
        for k, w, j in zip(keeps, words, count):
            split[k, w] += q ** j * (1 - q) ** (m - j)
    out = []
    for (keeps, words), chance in split.items():
        left = m - keeps - words
        if kind != "open":
            after = (kind, left)
        else:
            after = ("open", left) if words == 0 else ("placed" if words == 1 else "broken", left)
        out.append((chance, after))
    return out


def _word_patterns(m: int, q: float) -> torch.Tensor:
    """(R, m) bool: every arrangement of drawn words over m positions that has a chance."""
    if q in (0.0, 1.0):
        return torch.full((1, m), q == 1.0)
    bits = torch.arange(2 ** m).unsqueeze(-1).bitwise_right_shift(torch.arange(m)) & 1
    return bits.bool()


def _two_token_rows(p_word: float, patterns: torch.Tensor) -> torch.Tensor:
    """(R, m, 2) marginals over (keep, word); token 1 is the word, as `patterns` draws it."""
    row = torch.tensor([1.0 - p_word, p_word], dtype=torch.float32)
    return row.expand(*patterns.shape, 2).clone()


def _shuffle_step(state: tuple, step: int, n: int, scheduler: Scheduler,
                  temperature: float) -> list[tuple[float, tuple]]:
    kind, m = state[0], state[1]
    unplaced = m if kind == "open" else state[2]
    uniform = torch.zeros(1, m, unplaced + 1)          # one impossible token: top-2 always exists
    uniform[..., :unplaced] = 1.0 / unplaced
    count = int(decided_commits(scheduler, uniform, torch.zeros(1, m, dtype=torch.long), step, n,
                                temperature == 0).sum())
    out = []
    for distinct in range(1, count + 1):
        chance = _distinct_chance(count, distinct, unplaced)
        if chance == 0.0:
            continue
        if kind == "open" and distinct == count:
            out.append((chance, ("open", m - count)))
        else:
            out.append((chance, ("broken", m - count, unplaced - distinct)))
    return out


def _distinct_chance(draws: int, distinct: int, items: int) -> float:
    """Chance that `draws` uniform draws from `items` show exactly `distinct` different items:
    C(items, distinct) * surjections(draws -> distinct) / items^draws."""
    if distinct > items:
        return 0.0
    onto = sum((-1) ** i * math.comb(distinct, i) * (distinct - i) ** draws for i in range(distinct + 1))
    return math.comb(items, distinct) * onto / items ** draws
