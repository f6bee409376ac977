"""Load ParallelBench's released JSONL files from a local directory and score them offline.

Nothing is downloaded or vendored (the release has no license). Files, one JSON object per line:
`<dir>/waiting_line/<task>.jsonl`, `<dir>/puzzle/latin_square_n4.jsonl`,
`<dir>/puzzle/sudoku_n4_12.jsonl`, where `<dir>` is `dataset/parallel_bench/data/output/test`.
Two row layouts are read. The shipped one (ParallelBench at 72de8f7) keeps the reference under
`answer`, lists as JSON-style strings, Latin symbols as `"[H, 4, C, A]"` and the Sudoku grid under
`input.sudoku`; each such row is first rewritten (`_documented_row`) into the layout below:

* Waiting Line: `{"input": {"context": [items], "word": w?, "index": i?, "icl_examples": [...]},
  "label": [items] | {"input": [items], "word": w, "example": [items]}, "output_format": [...]}`.
* Latin square: `{"input": {"symbols": [4 symbols], "size": 4}, "label": "csv rows"}`.
* Sudoku: `{"input": {"context": "4 lines of 4 digits"} | "4 lines", "label": "4 lines"}`.

Prompts are rendered in this package's compact format with the items as a JSON-style list
(`copy : ["Billy Ramos", "Alan Wells"]`). Sort: the released labels are sorted by the full
"First Last" string, i.e. by first name, while the prompt says last name; `sort_by` picks the
order that is scored.

Scoring (`SCORING`): `parallelbench` (the default) is ParallelBench's own `score`, rule for rule
(`parallelbench_metrics`); `parallelbench_strict` its `score_strict`; `lenient` is this package's
older, more forgiving reading (text cut at the first end-of-text, single quotes stripped from
list items too, every digit of the output read as the Sudoku grid), which scores some answers
ParallelBench rejects: `['Billy Ramos', 'Alan Wells']` and a one-line Sudoku.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dllm_decode.eval.tasks import parallelbench_metrics as pb
from dllm_decode.eval.tasks.base import Example, EOS_TEXT
from dllm_decode.eval.tasks.puzzles import CELLS, SIZE, is_latin
from dllm_decode.eval.tasks.waiting_line import OPS

DIGITS = "0123456789"
"""ASCII digits: what a puzzle or an answer is written in (`str.isdigit` also takes "³", which
`int` refuses)."""
PUZZLE_FILES = {"latin_square": "puzzle/latin_square_n4.jsonl", "sudoku": "puzzle/sudoku_n4_12.jsonl"}
SORT_ORDERS = ("first", "last")
SCORING = ("parallelbench", "parallelbench_strict", "lenient")
"""How released outputs are scored; the first is the default (see the module docstring)."""


def list_to_str(items: list[str]) -> str:
    """ParallelBench's list rendering: `["a", "b"]`."""
    return "[" + ", ".join(f'"{x}"' for x in items) + "]"


def parse_list(text: str) -> list[str]:
    """The `lenient` mode's list reading: cut at the first end-of-text, after the last `[`, up to
    the next `]`, comma-split, single and double quotes and whitespace stripped."""
    text = text.split(EOS_TEXT, 1)[0]
    start = text.rfind("[")
    body = text[start + 1:] if start >= 0 else text
    body = body.split("]", 1)[0]
    return [part.strip().strip("'\"").strip() for part in body.split(",") if part.strip()]


def load_released(directory: str | Path, task: str, sort_by: str = "first") -> list[Example]:
    """Examples of one released task file.

    Args:
        directory: the released `output/test` directory.
        task: a Waiting Line op name (`copy`, ..., `replace_random`), `latin_square` or `sudoku`.
        sort_by: "first" (the released labels) or "last" (what the Sort prompt asks for).
    Raises:
        ValueError: unknown task or sort order; FileNotFoundError: missing file.
    """
    if sort_by not in SORT_ORDERS:
        raise ValueError(f"sort_by must be one of {SORT_ORDERS}, got {sort_by!r}")
    if task not in OPS and task not in PUZZLE_FILES:
        raise ValueError(f"unknown released task {task!r}; choose from "
                         f"{sorted(OPS) + sorted(PUZZLE_FILES)}")
    path = Path(directory) / PUZZLE_FILES.get(task, f"waiting_line/{task}.jsonl")
    rows = [_documented_row(task, json.loads(line)) for line in path.read_text().splitlines()
            if line.strip()]
    make = {"latin_square": _latin, "sudoku": _sudoku}.get(task, _list_example)
    return [make(task, row, sort_by) for row in rows]


def _documented_row(name: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row of the shipped layout rewritten into the documented one (rows with `label` pass)."""
    if "label" in row:
        return row
    inp, answer = dict(row.get("input") or {}), row.get("answer")
    if name == "sudoku":
        return {"input": {"context": inp.get("sudoku", inp.get("context", ""))}, "label": answer}
    if name == "latin_square":
        symbols = inp.get("symbols")
        inp["symbols"] = pb.parse_list(symbols) if isinstance(symbols, str) else symbols
        if isinstance(answer, dict) and answer.get("first_row") is not None:
            inp["first_row"] = answer["first_row"]
        return {"input": inp, "label": answer.get("example") if isinstance(answer, dict) else answer}
    if isinstance(inp.get("context"), str):
        inp["context"] = pb.parse_list(inp["context"])
    if isinstance(answer, dict):
        label = {**answer, "example": pb.parse_list(answer["example"])
                 if isinstance(answer.get("example"), str) else answer.get("example")}
    else:
        label = pb.parse_list(answer) if isinstance(answer, str) else answer
    return {"input": inp, "label": label, "label_text": answer if isinstance(answer, str) else None}


def _list_example(task: str, row: dict[str, Any], sort_by: str) -> Example:
    inp, label = row["input"], row["label"]
    items = list(inp["context"] if isinstance(inp, dict) else inp)
    word = inp.get("word") if isinstance(inp, dict) else None
    index = inp.get("index") if isinstance(inp, dict) else None
    if isinstance(label, dict):             # random-position tasks: one valid example + the input
        items, word = list(label.get("input", items)), label.get("word", word)
        reference = list(label["example"])
    else:
        reference = list(label)
    answer = row.get("label_text") or list_to_str(reference)   # the released text, as scored there
    if task == "sort" and sort_by == "last":
        reference = sorted(items, key=lambda name: (name.split()[-1], name))
        answer = list_to_str(reference)
    head = OPS[task].head(word, index)
    return Example(f"released/{task}", " ".join([*head, ":", list_to_str(items)]), answer,
                   {"items": items, "word": word, "index": index, "format": "json",
                    "sort_by": sort_by if task == "sort" else None})


def _latin(task: str, row: dict[str, Any], sort_by: str) -> Example:
    inp = row["input"]
    symbols = [str(s) for s in (inp.get("symbols") or inp.get("context"))]
    return Example("released/latin_square", "latin : " + " ".join(symbols), str(row["label"]),
                   {"symbols": symbols, "first_row": inp.get("first_row"), "format": "csv"})


def _sudoku(task: str, row: dict[str, Any], sort_by: str) -> Example:
    inp = row["input"]
    puzzle = inp.get("context", "") if isinstance(inp, dict) else inp
    digits = [int(ch) for ch in str(puzzle) if ch in DIGITS]
    return Example("released/sudoku", "sudoku : " + " ".join(map(str, digits)),
                   str(row.get("label", row.get("output", ""))), {"puzzle": digits, "format": "grid"})


def latin_csv_cells(text: str, symbols: list[str]) -> list[str]:
    """The `lenient` mode's Latin-square reading: keep the lines of `SIZE` non-empty cells whose
    set is the symbol set, take the first `SIZE` of them, return their cells row-major."""
    rows = []
    for line in text.split(EOS_TEXT, 1)[0].splitlines():
        cells = [c.strip() for c in line.split(",") if c.strip()]
        if len(cells) == SIZE and set(cells) == set(symbols):
            rows.append(cells)
    return [c for row in rows[:SIZE] for c in row]


def score_released(example: Example, output_text: str, mode: str = "parallelbench") -> float:
    """A released example's score in one of the `SCORING` modes (default: ParallelBench's own
    `score`): exact list match, the random-op and shuffle validity checkers, the Latin-square
    checker, or exact Sudoku match. Never raises on any output text.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in SCORING:
        raise ValueError(f"released scoring must be one of {SCORING}, got {mode!r}")
    if mode == "lenient":
        return _score_lenient(example, output_text)
    strict = mode == "parallelbench_strict"
    task, meta = example.task.removeprefix("released/"), example.meta
    if task == "latin_square":
        return pb.latin_square(output_text, meta["symbols"], meta.get("first_row"))
    if task == "sudoku":
        return pb.sudoku(output_text, example.answer, strict)
    if task == "shuffle":
        return pb.list_shuffle(output_text, meta["items"], strict)
    if task == "insert_random":
        return pb.random_insert(output_text, meta["items"], meta["word"], strict)
    if task == "remove_random":
        return pb.random_remove(output_text, meta["items"], strict)
    if task == "replace_random":
        return pb.random_replace(output_text, meta["items"], meta["word"], strict)
    return pb.list_match(output_text, example.answer, strict)


def _score_lenient(example: Example, output_text: str) -> float:
    task = example.task.removeprefix("released/")
    if task == "latin_square":
        return float(is_latin(latin_csv_cells(output_text, example.meta["symbols"]),
                              example.meta["symbols"]))
    if task == "sudoku":
        def grid(text: str) -> list[str]:
            return [ch for ch in text.split(EOS_TEXT, 1)[0] if ch in DIGITS]
        out = grid(output_text)
        return float(len(out) == CELLS and out == grid(example.answer))
    op, meta, out = OPS[task], example.meta, parse_list(output_text)
    if op.valid is None:
        return float(out == parse_list(example.answer))
    return float(op.valid(meta["items"], meta["word"], meta["index"], out))
