"""ParallelBench's list and puzzle metrics, rule for rule (Kang et al., 2025, arXiv 2510.04767;
`dataset/parallel_bench/metrics.py` at furiosa-ai/ParallelBench 72de8f7, re-implemented from its
behaviour: the release has no license, so no code is copied).

Each function takes the model's output text as ParallelBench receives it and returns what its
metric returns, `score` (lenient, the headline number) or, with `strict=True`, `score_strict`:

* Lists. Lenient: the text after the last `[` and before the next `]` (the whole text when
  either bracket is missing), outer brackets stripped, split on `,`; empty (whitespace-only)
  items dropped, then each item stripped of double quotes and spaces only, so `'Billy Ramos'`
  keeps its single quotes and a tab or newline next to an item stays. Strict: both brackets
  present, items separated by exactly `, `, each wrapped in double quotes with none inside.
* Sudoku 4x4. Lenient: spaces and commas removed, the non-empty lines kept when they hold
  exactly 4 digits (`\\d`, any script), and exactly 4 such lines required; so a one-line answer
  fails and a sentence before the grid does no harm. Strict: exactly 4 non-empty lines of
  exactly 4 characters, each a digit.
* Latin square: the non-empty lines whose comma-separated cells (stripped) form exactly the
  symbol set, the first `len(symbols)` of them; every row and every column (of the zip of those
  rows) must be the symbol set, and the first row must equal `first_row` when the label has one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

LIST_ITEM_STRIP = '" '
"""The only characters ParallelBench strips from a list item (not single quotes, tabs, newlines)."""


def parse_list(text: str, strict: bool = False) -> list[str] | None:
    """A list from model text (see the module docstring); None when strict parsing fails."""
    if "[" in text:
        text = text.rsplit("[", 1)[1]
    elif strict:
        return None
    if "]" in text:
        text = text.split("]", 1)[0]
    elif strict:
        return None
    if not strict:
        return [item.strip(LIST_ITEM_STRIP) for item in text.strip("[]").split(",") if item.strip()]
    items = []
    for item in text.split(", "):
        if len(item) < 1 or not (item.startswith('"') and item.endswith('"')):
            return None
        inner = item[1:-1]
        if '"' in inner:
            return None
        items.append(inner)
    return items


def list_match(prediction: str, label: str, strict: bool = False) -> float:
    """`list_match_score`: the parsed output equals the label parsed leniently."""
    got = parse_list(prediction, strict)
    return 0.0 if got is None else float(got == parse_list(label))


def list_shuffle(prediction: str, items: Sequence[str], strict: bool = False) -> float:
    """`list_shuffle_score`: a rearrangement of the input that differs from it."""
    got = parse_list(prediction, strict)
    return 0.0 if got is None else float(sorted(got) == sorted(items) and got != list(items))


def random_insert(prediction: str, items: Sequence[str], word: str, strict: bool = False) -> float:
    """`list_random_insert_score`: removing the first occurrence of `word` leaves the input."""
    got = parse_list(prediction, strict)
    if got is None or word not in got:
        return 0.0
    got.remove(word)
    return float(got == list(items))


def random_remove(prediction: str, items: Sequence[str], strict: bool = False,
                  n_words: int = 1) -> float:
    """`list_random_remove_score`: `n_words` shorter, exactly `n_words` distinct input items gone
    (first occurrences), the rest in order."""
    got = parse_list(prediction, strict)
    if got is None or len(got) != len(items) - n_words:
        return 0.0
    gone = set(items) - set(got)
    if len(gone) != n_words:
        return 0.0
    rest = list(items)
    for item in gone:
        rest.remove(item)
    return float(got == rest)


def random_replace(prediction: str, items: Sequence[str], word: str, strict: bool = False) -> float:
    """`list_random_replace_score`: same length; writing `word` into the input at the first
    position where the output has it gives the output."""
    got = parse_list(prediction, strict)
    if got is None or len(got) != len(items) or word not in got:
        return 0.0
    expected = list(items)
    expected[got.index(word)] = word
    return float(got == expected)


def parse_sudoku(text: str, strict: bool = False, size: int = 4) -> list[list[int]] | None:
    """A 4x4 grid from text (see the module docstring), or None."""
    text = text.strip()
    if not strict:
        text = text.replace(" ", "").replace(",", "")
        rows = [[int(d) for d in re.findall(r"\d", line)] for line in
                (raw.strip() for raw in text.split("\n")) if line]
        grid = [row for row in rows if len(row) == size]
        return grid if len(grid) == size else None
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    if len(lines) != size or any(len(line) != size for line in lines):
        return None
    try:
        return [[int(ch) for ch in line] for line in lines]
    except ValueError:
        return None


def sudoku(prediction: str, label: str, strict: bool = False) -> float:
    """`sudoku_score`: the parsed grid equals the label's, parsed strictly (two unparseable texts
    compare equal, as ParallelBench's `None == None` does)."""
    return float(parse_sudoku(prediction, strict) == parse_sudoku(label, strict=True))


def latin_square(prediction: str, symbols: Sequence[str], first_row: Sequence[str] | None = None) -> float:
    """`latin_square_score` (it has no strict variant: `strict` changes nothing there)."""
    wanted = set(symbols)
    size = len(wanted)
    lines = [line.strip() for line in prediction.split("\n") if line.strip()]
    lines = [line for line in lines if {cell.strip() for cell in line.split(",")} == wanted]
    if len(lines) < size:
        return 0.0
    rows = [[cell.strip() for cell in line.split(",")] for line in lines[:size]]
    if any(set(row) != wanted for row in rows) or any(set(col) != wanted for col in zip(*rows)):
        return 0.0
    if first_row is not None and rows[0] != list(first_row):
        return 0.0
    return 1.0
