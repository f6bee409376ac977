"""Closed forms of ParallelBench's analysis (Kang et al., 2025, arXiv 2510.04767, §3-4, App. A).

Conditional total correlation C(Y|X) = sum_i H(y_i|X) - H(Y|X), the T-step bound L_T of
Theorem 1, and the exact accuracy of the paper's unbiased ideal model under fixed-step (top-k)
and threshold decoding for Shuffle (Eq. 5) and Replace Random (§4.2). Logs are base 2.

A decoding is described by its *partition*: the number of answer positions committed at each
step, e.g. `(2, 2, 2)` for n = 6 at two tokens per step. The ideal model's per-position
marginals given the committed part are the exact posteriors: Shuffle, uniform over the m items
not yet placed; Replace Random, "keep" with probability (m-1)/m and the new word with 1/m while
the word is unplaced among the m masked positions.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Hashable, Sequence

THEORY_TASKS = ("shuffle", "replace_random")
"""Tasks with a closed-form ideal-model accuracy."""


def entropy(counts: Sequence[float]) -> float:
    """Shannon entropy (bits) of unnormalised counts or probabilities."""
    total = float(sum(counts))
    return -sum(c / total * math.log2(c / total) for c in counts if c > 0)


def total_correlation(outcomes: Sequence[Sequence[Hashable]],
                      weights: Sequence[float] | None = None) -> float:
    """C(Y|X) for one X: sum of the positions' marginal entropies minus the joint entropy.

    Args:
        outcomes: the possible outputs Y (equal-length tuples); repeats add up.
        weights: their probabilities (default uniform over the listed outcomes).
    """
    weights = list(weights) if weights is not None else [1.0] * len(outcomes)
    joint: Counter = Counter()
    for y, w in zip(outcomes, weights):
        joint[tuple(y)] += w
    width = len(next(iter(joint)))
    marginal = 0.0
    for i in range(width):
        column: Counter = Counter()
        for y, w in joint.items():
            column[y[i]] += w
        marginal += entropy(list(column.values()))
    return marginal - entropy(list(joint.values()))


def shuffle_total_correlation(n: int) -> float:
    """Shuffle, Y uniform over the n! permutations: n log2 n - log2 n! (Table 1)."""
    return n * math.log2(n) - math.log2(math.factorial(n))


def replace_random_total_correlation(n: int) -> float:
    """Replace Random: (n-1)(log2 n - log2(n-1)) (Table 1); tends to log2 e."""
    return 0.0 if n < 2 else (n - 1) * (math.log2(n) - math.log2(n - 1))


def shuffle_bound(partition: Sequence[int]) -> float:
    """L_T of Theorem 1 for Shuffle: sum_t |S_t| log2 k_t - log2 n!, k_t the items left."""
    n, left, total = sum(partition), sum(partition), 0.0
    for size in partition:
        total += size * math.log2(left)
        left -= size
    return total - math.log2(math.factorial(n))


@functools.cache
def list_task_total_correlation(task: str, n: int) -> float:
    """C(Y|X) of a Waiting Line task with n distinct items (0 for the deterministic ops).

    The random-position ops are enumerated over their uniformly drawn position; Shuffle and
    Replace Random use the closed forms. Raises ValueError for a task that is not a list op.
    """
    items = tuple(range(n))
    word = "new"
    if task == "shuffle":
        return shuffle_total_correlation(n)
    if task == "replace_random":
        return replace_random_total_correlation(n)
    if task == "insert_random":
        return total_correlation([items[:j] + (word,) + items[j:] for j in range(n + 1)])
    if task == "remove_random":
        return total_correlation([items[:j] + items[j + 1:] for j in range(n)]) if n > 1 else 0.0
    if task in ("copy", "sort", "reverse", "insert_index", "remove_index", "replace_index"):
        return 0.0
    raise ValueError(f"no total-correlation formula for list task {task!r}")


@functools.cache
def latin_square_total_correlation(size: int = 4) -> float:
    """C(Y|X) of ParallelBench's Latin-square generator: a cyclic square with uniformly shuffled
    rows and columns (144 distinct 4x4 squares, equally likely: 32 - log2 144 = 24.83 bits)."""
    squares = [tuple((r + c) % size for r in rows for c in cols)
               for rows in itertools.permutations(range(size))
               for cols in itertools.permutations(range(size))]
    return total_correlation(squares)


def task_total_correlation(task: str, n: int | None) -> float | None:
    """C(Y|X) in bits for a task name (a `released/` prefix is ignored); None when unknown.

    Sudoku has a unique solution (C = 0); the Latin square is the generator's value.
    """
    name = task.removeprefix("released/")
    if name == "sudoku":
        return 0.0
    if name == "latin_square":
        return latin_square_total_correlation()
    if n is None:
        return None
    try:
        return list_task_total_correlation(name, n)
    except ValueError:
        return None


def fixed_step_partition(n: int, steps: int) -> tuple[int, ...]:
    """Sizes committed per step when n positions are spread over `steps` steps the LLaDA way
    (ceil(m / steps left) each step, at least one): `dllm_decode.schedulers.fixed_steps` on one block."""
    sizes, left = [], n
    for steps_left in range(steps, 0, -1):
        if left == 0:
            break
        size = max(1, -(-left // steps_left))
        sizes.append(size)
        left -= size
    return tuple(sizes)


def shuffle_accuracy(partition: Sequence[int]) -> float:
    """Eq. 5: prod_t P(m_t, s_t) / m_t^s_t, the chance that every step's independent uniform
    draws over the m_t unplaced items are distinct (greedy or sampled alike)."""
    left, acc = sum(partition), 1.0
    for size in partition:
        acc *= math.perm(left, size) / left ** size
        left -= size
    return acc


def replace_random_accuracy(partition: Sequence[int], sampled: bool,
                            confidence_ranked: bool = False) -> float:
    """Replace Random under a partition (§4.2).

    Greedy: with m > 2 positions left every argmax is "keep", so the word is only placed when the
    last step has one position (success), or two with tied 0.5/0.5 marginals (0.5, random ties).
    Sampled (temperature 1), a step with m left drawing for s positions, each drawing the word
    with chance 1/m:

    * positions chosen independently of the draws (random, margin and entropy ranking: the last
      two score every position alike): success at once if exactly one of the s draws is the word,
      continue if none is; the one-step case is ((n-1)/n)^(n-1) -> 1/e (§4.2);
    * confidence ranking (`low_confidence`): a "keep" draw has confidence (m-1)/m > 1/m, so keeps
      win the ranks (for m > 2; at m = 2 all tie). With K ~ Binomial(m, (m-1)/m) keep draws the
      step continues if K >= s, succeeds if K = s - 1 (exactly one word committed) and fails
      otherwise. At n = 4, two per step: 0.5215, where the independent formula gives 0.656.
    """
    if not sampled:
        last = partition[-1] if partition else 0
        return {1: 1.0, 2: 0.5}.get(last, 0.0)
    left, reach, acc = sum(partition), 1.0, 0.0
    for size in partition:
        keep = (left - 1) / left
        if confidence_ranked and left > 2:
            keeps = [math.comb(left, k) * keep ** k * (1 - keep) ** (left - k) for k in range(left + 1)]
            acc += reach * keeps[size - 1]
            reach *= sum(keeps[size:])
        else:
            acc += reach * size * (1 / left) * keep ** (size - 1)
            reach *= keep ** size
        left -= size
    return acc


def threshold_partition(task: str, n: int, threshold: float) -> tuple[int, ...] | None:
    """The greedy ideal model's partition under a confidence threshold (>=, at least one).

    Shuffle confidences are 1/m; Replace Random's are (m-1)/m ("keep") while m > 2. Returns None
    for a task without a closed form.
    """
    sizes, left = [], n
    while left:
        if task == "shuffle":
            confidence = 1 / left
        elif task == "replace_random":
            confidence = (left - 1) / left if left > 2 else (1.0 if left == 1 else 0.5)
        else:
            return None
        size = left if confidence >= threshold else 1
        sizes.append(size)
        left -= size
    return tuple(sizes)


def ideal_accuracy(task: str, partition: Sequence[int], sampled: bool,
                   confidence_ranked: bool = False) -> float | None:
    """Ideal-model accuracy (0-1) of `task` under `partition`; None when there is no closed form.

    `confidence_ranked`: the committed positions are the most confident draws (matters only for
    sampled Replace Random; Shuffle's confidences are equal whatever a position drew)."""
    name = task.removeprefix("released/")
    if name == "shuffle":
        return shuffle_accuracy(partition)
    if name == "replace_random":
        return replace_random_accuracy(partition, sampled, confidence_ranked)
    return None
