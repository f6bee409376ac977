"""Which examples an evaluation runs: the `--tasks` selection, parsed into scored task lists.

A selection is a comma list of built-in task names (`copy`, `sudoku`, ...), groups (`all`,
`waiting_line`, `puzzles`), and `released:DIR` (every ParallelBench task file found in the
released `output/test` directory DIR) or `released:DIR#copy+sudoku` (some of them). Built-in
tasks draw `limit` (default 100, ParallelBench's size) seeded test-split examples; released
tasks take the first `limit` lines of their file and are scored as ParallelBench scores them
unless another `released.SCORING` mode is asked for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dllm_decode.cost import MAX_PROMPTS
from dllm_decode.eval.tasks import TASKS, WAITING_LINE, Example, load_released, score_released
from dllm_decode.eval.tasks.released import PUZZLE_FILES, SCORING
from dllm_decode.eval.tasks.text import TEXT_FILES, load_text_task, missing_scorers, text_scorer

DEFAULT_PER_TASK = 100
PUZZLES = ("latin_square", "sudoku")
GROUPS: dict[str, tuple[str, ...]] = {
    "all": tuple(TASKS),
    "waiting_line": WAITING_LINE,
    "puzzles": PUZZLES,
}
RELEASED_PREFIX = "released:"


@dataclass(frozen=True)
class TaskRun:
    """One task of the selection: its examples and its scorer (text -> score in [0, 1])."""

    name: str
    examples: tuple[Example, ...]
    score: Callable[[Example, str], float]


def released_files(directory: Path) -> dict[str, Path]:
    """Released task name -> file, for every known task file present under `directory`."""
    known = {**{op: f"waiting_line/{op}.jsonl" for op in WAITING_LINE}, **PUZZLE_FILES,
             **TEXT_FILES}
    return {name: directory / rel for name, rel in known.items() if (directory / rel).is_file()}


def select_tasks(selection: str, limit: int | None = None, seed: int = 0,
                 sort_by: str = "first", released_scoring: str = SCORING[0]
                 ) -> tuple[list[TaskRun], list[str]]:
    """Parse a selection into task runs, plus one message per skipped task.

    Args:
        selection: see the module docstring.
        limit: examples per task (None: 100 for built-in tasks, the whole file for released ones).
        seed: the built-in generators' seed.
        sort_by: released Sort labels, "first" (as released) or "last" name (as the prompt says).
        released_scoring: how released list and puzzle outputs are scored (`released.SCORING`;
            default ParallelBench's own `score`).
    Raises:
        ValueError: an unknown name or scoring mode, a missing released directory or task, a
            bad limit.
    """
    if limit is not None and not 1 <= limit <= 2 * MAX_PROMPTS:     # a tuning split's two halves
        raise ValueError(f"limit must be in [1, {2 * MAX_PROMPTS}], got {limit}")
    if released_scoring not in SCORING:
        raise ValueError(f"released scoring must be one of {SCORING}, got {released_scoring!r}")
    runs: list[TaskRun] = []
    skipped: list[str] = []
    for token in filter(None, (part.strip() for part in selection.split(","))):
        if token.startswith(RELEASED_PREFIX):
            more, why = _released(token[len(RELEASED_PREFIX):], limit, sort_by, released_scoring)
            runs += more
            skipped += why
        elif token in GROUPS or token in TASKS:
            for name in GROUPS.get(token, (token,)):
                task = TASKS[name]
                examples = task.examples("test", limit or DEFAULT_PER_TASK, seed)
                runs.append(TaskRun(name, tuple(examples), task.score))
        else:
            raise ValueError(f"unknown task {token!r}; choose from {sorted(TASKS)}, groups "
                             f"{sorted(GROUPS)}, or released:DIR[#task+task]")
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        runs = list({run.name: run for run in runs}.values())   # `all,copy` runs copy once
    if not runs and not skipped:
        raise ValueError(f"the task selection {selection!r} is empty")
    return runs, skipped


def _released(spec: str, limit: int | None, sort_by: str,
              scoring: str) -> tuple[list[TaskRun], list[str]]:
    path_text, _, wanted_text = spec.partition("#")
    directory = Path(path_text).expanduser()
    if not directory.is_dir():
        raise ValueError(f"released directory {str(directory)!r} does not exist")
    found = released_files(directory)
    wanted = [w for w in wanted_text.split("+") if w] or list(found)
    if unknown := [w for w in wanted if w not in found]:
        raise ValueError(f"released task(s) {unknown} not found in {directory}; present: "
                         f"{sorted(found)}")
    if not wanted:
        raise ValueError(f"{directory} holds no ParallelBench task file (expected e.g. "
                         f"waiting_line/copy.jsonl under the released output/test directory)")
    runs, skipped = [], []
    for name in wanted:
        if name in TEXT_FILES:
            if missing := missing_scorers(name):
                skipped.append(f"skipped released/{name}: its metric needs {', '.join(missing)} "
                               f"(pip install {' '.join(m.replace('_', '-') for m in missing)}; "
                               f"the grammar score also needs Java)")
                continue
            examples, score = load_text_task(directory, name), text_scorer(name)
        else:
            examples = load_released(directory, name, sort_by=sort_by)
            score = functools.partial(score_released, mode=scoring)
        runs.append(TaskRun(f"released/{name}", tuple(examples[:limit]), score))
    return runs, skipped
