"""The `Example` record, the train/test partition and the shared sampling loop of every task."""

from __future__ import annotations

import abc
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

EOS_TEXT = "<|endoftext|>"
SPLITS = ("train", "test")
TEST_SHARE = 10
"""One instance in `TEST_SHARE` lands in the test split."""


@dataclass(frozen=True)
class Example:
    """One task instance.

    Attributes:
        task: registry name of the task that made it.
        prompt: space-separated words, e.g. `sort : carol alice bob`.
        answer: one reference answer (random-position tasks accept others, see the scorer).
        meta: what the scorer and the ideal model need (items, word, index, symbols, puzzle...).
    """

    task: str
    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


def split_of(task: str, prompt: str) -> str:
    """The split an instance belongs to, from a hash of its prompt, so splits never share one."""
    digest = hashlib.sha256(f"{task}\x00{prompt}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "little") % TEST_SHARE == 0 else "train"


def output_words(text: str) -> list[str]:
    """Words of a model output: everything before the first end-of-text, split on whitespace."""
    return text.split(EOS_TEXT, 1)[0].split()


class Task(abc.ABC):
    """A seeded generator plus a scorer. Subclasses implement `_sample` and `score`."""

    name: str
    default_lengths: tuple[int, int] = (3, 6)

    @abc.abstractmethod
    def _sample(self, rng: random.Random, length: int) -> Example:
        """Draw one instance with `length` input items (puzzles ignore it)."""

    @abc.abstractmethod
    def score(self, example: Example, output_text: str) -> float:
        """1.0 if `output_text` solves `example`, else 0.0; never raises on garbage."""

    def examples(self, split: str, n: int, seed: int = 0,
                 lengths: tuple[int, int] | None = None) -> list[Example]:
        """`n` distinct instances of `split`, lengths cycling evenly over `lengths` (inclusive).

        Args:
            split: "train" or "test".
            n: number of examples.
            seed: the same (split, n, seed, lengths) always gives the same list.
            lengths: (min, max) input list length; default (3, 6) as ParallelBench.
        Raises:
            ValueError: unknown split, bad lengths, or fewer than `n` distinct instances exist.
        """
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        low, high = lengths or self.default_lengths
        if not 1 <= low <= high:
            raise ValueError(f"lengths must satisfy 1 <= min <= max, got {(low, high)}")
        rng = random.Random(f"{self.name}|{split}|{seed}|{low}|{high}")
        out: list[Example] = []
        seen: set[str] = set()
        budget = 200 * n + 1000      # rejection sampling: ~10x for the test split, plus duplicates
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise ValueError(f"{self.name}: fewer than {n} distinct {split} instances "
                                 f"with lengths {(low, high)}")
            ex = self._sample(rng, low + len(out) % (high - low + 1))
            if ex.prompt in seen or split_of(self.name, ex.prompt) != split:
                continue
            seen.add(ex.prompt)
            out.append(ex)
        return out
