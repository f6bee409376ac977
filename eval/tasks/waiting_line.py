"""The ten Waiting Line list operations of ParallelBench, over one-token names.

Prompt format: `<op> [<word>] [at <index>] : <items>`; the answer is the resulting item list,
space-separated. Indices are 0-based (ParallelBench draws them with `randint` from 0). Metrics:
exact match for the deterministic ops; the validity checkers of ParallelBench for shuffle (a
permutation that differs from the input) and the random-position variants.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from dllm_decode.eval.tasks.base import Example, Task, output_words
from dllm_decode.eval.tasks.vocab import NAMES

Items = list[str]


@dataclass(frozen=True)
class ListOp:
    """How one list operation writes its prompt, draws its answer and checks an output.

    Attributes:
        head: prompt words before ":" given (word, index); word/index may be None.
        answer: (rng, items, word, index) -> one reference answer.
        valid: (items, word, index, output) -> bool; None means exact match to the reference.
        uses_word: draw a new item that is not in the list.
        index_range: None, or the index range offset: index in [0, n + offset].
    """

    head: Callable[[str | None, int | None], list[str]]
    answer: Callable[[random.Random, Items, str | None, int | None], Items]
    valid: Callable[[Items, str | None, int | None, Items], bool] | None = None
    uses_word: bool = False
    index_range: int | None = None


def _shuffled(rng: random.Random, items: Items) -> Items:
    # ParallelBench's reference shuffle differs from the input; n >= 2 guarantees one exists.
    while True:
        out = rng.sample(items, len(items))
        if out != items or len(items) < 2:
            return out


def _is_shuffle(items: Items, _w, _i, out: Items) -> bool:
    return sorted(out) == sorted(items) and out != items


def _is_insert(items: Items, word, _i, out: Items) -> bool:
    return out.count(word) == 1 and [x for x in out if x != word] == items


def _is_remove(items: Items, _w, _i, out: Items) -> bool:
    return len(out) == len(items) - 1 and any(
        items[:j] + items[j + 1:] == out for j in range(len(items)))


def _is_replace(items: Items, word, _i, out: Items) -> bool:
    return len(out) == len(items) and any(
        out[j] == word and out[:j] == items[:j] and out[j + 1:] == items[j + 1:]
        for j in range(len(items)))


OPS: dict[str, ListOp] = {
    "copy": ListOp(lambda w, i: ["copy"], lambda r, xs, w, i: list(xs)),
    "sort": ListOp(lambda w, i: ["sort"], lambda r, xs, w, i: sorted(xs)),
    "reverse": ListOp(lambda w, i: ["reverse"], lambda r, xs, w, i: xs[::-1]),
    "shuffle": ListOp(lambda w, i: ["shuffle"], lambda r, xs, w, i: _shuffled(r, xs),
                      _is_shuffle),
    "insert_index": ListOp(lambda w, i: ["insert", w, "at", str(i)],
                           lambda r, xs, w, i: xs[:i] + [w] + xs[i:],
                           uses_word=True, index_range=0),
    "insert_random": ListOp(lambda w, i: ["insert", w],
                            lambda r, xs, w, i: _insert_at(xs, w, r.randint(0, len(xs))),
                            _is_insert, uses_word=True),
    "remove_index": ListOp(lambda w, i: ["remove", "at", str(i)],
                           lambda r, xs, w, i: xs[:i] + xs[i + 1:], index_range=-1),
    "remove_random": ListOp(lambda w, i: ["remove"],
                            lambda r, xs, w, i: _remove_at(xs, r.randrange(len(xs))),
                            _is_remove),
    "replace_index": ListOp(lambda w, i: ["replace", "at", str(i), "with", w],
                            lambda r, xs, w, i: xs[:i] + [w] + xs[i + 1:],
                            uses_word=True, index_range=-1),
    "replace_random": ListOp(lambda w, i: ["replace", "with", w],
                             lambda r, xs, w, i: _replace_at(xs, w, r.randrange(len(xs))),
                             _is_replace, uses_word=True),
}


def _insert_at(items: Items, word: str, j: int) -> Items:
    return items[:j] + [word] + items[j:]


def _remove_at(items: Items, j: int) -> Items:
    return items[:j] + items[j + 1:]


def _replace_at(items: Items, word: str, j: int) -> Items:
    return items[:j] + [word] + items[j + 1:]


class ListTask(Task):
    """One Waiting Line operation; `meta` holds `items`, `word` and `index` (None when unused)."""

    def __init__(self, name: str, pool: tuple[str, ...] = NAMES):
        self.name = name
        self.op = OPS[name]
        self.pool = pool

    def _sample(self, rng: random.Random, length: int) -> Example:
        if length + 1 > len(self.pool):
            raise ValueError(f"{self.name}: length {length} needs more than {len(self.pool)} names")
        drawn = rng.sample(self.pool, length + 1)    # the extra one is the new word, never in the list
        items, word = drawn[:length], (drawn[length] if self.op.uses_word else None)
        index = None if self.op.index_range is None else rng.randint(0, length + self.op.index_range)
        answer = self.op.answer(rng, items, word, index)
        prompt = " ".join([*self.op.head(word, index), ":", *items])
        return Example(self.name, prompt, " ".join(answer),
                       {"items": items, "word": word, "index": index})

    def score(self, example: Example, output_text: str) -> float:
        return float(self.check(example, output_words(output_text)))

    def check(self, example: Example, out: Items) -> bool:
        """Whether the output word list `out` solves `example`."""
        meta = example.meta
        if self.op.valid is None:
            return out == example.answer.split()
        return self.op.valid(meta["items"], meta["word"], meta["index"], out)
