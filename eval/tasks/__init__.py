"""ParallelBench-style tasks: seeded offline generators and scorers.

`TASKS` maps a name to a task object with `examples(split, n, seed, lengths=...)` and
`score(example, output_text)`. `load_released` reads ParallelBench's own JSONL files.
"""

from dllm_decode.eval.tasks.base import EOS_TEXT, Example, Task, output_words, split_of
from dllm_decode.eval.tasks.puzzles import LatinSquareTask, SudokuTask
from dllm_decode.eval.tasks.released import load_released, score_released
from dllm_decode.eval.tasks.waiting_line import OPS, ListTask

WAITING_LINE = tuple(OPS)
"""The ten Waiting Line ops, in ParallelBench's table order."""
LONG_LENGTHS = (8, 12)
"""List lengths of the stress split (ParallelBench uses 3-6)."""

TASKS: dict[str, Task] = {
    **{name: ListTask(name) for name in WAITING_LINE},
    "latin_square": LatinSquareTask(),
    "sudoku": SudokuTask(),
}

__all__ = ["EOS_TEXT", "Example", "LONG_LENGTHS", "TASKS", "Task", "WAITING_LINE",
           "load_released", "output_words", "score_released", "split_of"]
