"""4x4 Latin square (any valid square accepted) and 4x4 Sudoku (unique solution, exact match).

Prompts: `latin : A 7 K Q` and `sudoku : 1 0 3 4 ...` (16 cells, row-major, 0 = blank). Answers
are the 16 cells row-major, space-separated, without row separators.
"""

from __future__ import annotations

import functools

import random

import numpy as np

from dllm_decode.eval.tasks.base import Example, Task, output_words
from dllm_decode.eval.tasks.vocab import SYMBOLS

SIZE = 4
CELLS = SIZE * SIZE


def is_latin(cells: list[str], symbols: list[str]) -> bool:
    """Every row and column of the row-major `cells` is a permutation of `symbols`."""
    if len(cells) != CELLS:
        return False
    rows = [cells[r * SIZE:(r + 1) * SIZE] for r in range(SIZE)]
    lines = rows + [list(col) for col in zip(*rows)]
    return all(sorted(line) == sorted(symbols) for line in lines)


def cyclic_latin(symbols: list[str], rows=range(SIZE), cols=range(SIZE)) -> list[str]:
    """Row-major cells of the cyclic square `symbols[(r + c) % n]` in the given row and column
    order; the default order gives the canonical square (row r = `symbols` rotated left by r)."""
    return [symbols[(r + c) % SIZE] for r in rows for c in cols]


class LatinSquareTask(Task):
    """ParallelBench `latin_square_n4`: 4 symbols from A-Z/0-9; the reference is a cyclic square
    with shuffled rows and columns, but any valid square scores 1."""

    name = "latin_square"

    def _sample(self, rng: random.Random, length: int) -> Example:
        symbols = rng.sample(SYMBOLS, SIZE)
        rows, cols = rng.sample(range(SIZE), SIZE), rng.sample(range(SIZE), SIZE)
        return Example(self.name, "latin : " + " ".join(symbols),
                       " ".join(cyclic_latin(symbols, rows, cols)), {"symbols": symbols})

    def score(self, example: Example, output_text: str) -> float:
        return float(is_latin(output_words(output_text), example.meta["symbols"]))


def _peers(cell: int) -> set[int]:
    r, c = divmod(cell, SIZE)
    box = {(r // 2 * 2 + i) * SIZE + c // 2 * 2 + j for i in range(2) for j in range(2)}
    return ({r * SIZE + j for j in range(SIZE)} | {i * SIZE + c for i in range(SIZE)} | box) - {cell}


def _line_peers(cell: int) -> set[int]:
    r, c = divmod(cell, SIZE)
    return ({r * SIZE + j for j in range(SIZE)} | {i * SIZE + c for i in range(SIZE)}) - {cell}


PEERS = tuple(frozenset(_peers(cell)) for cell in range(CELLS))
LINE_PEERS = tuple(frozenset(_line_peers(cell)) for cell in range(CELLS))


def _fill_all(peers: tuple[frozenset[int], ...]) -> tuple[tuple[int, ...], ...]:
    """Every row-major grid over digits 1-4 in which no cell repeats a digit of its peers."""
    grids = []

    def fill(grid: list[int], cell: int) -> None:
        if cell == CELLS:
            grids.append(tuple(grid))
            return
        for digit in range(1, SIZE + 1):
            if all(grid[p] != digit for p in peers[cell] if p < cell):
                grid[cell] = digit
                fill(grid, cell + 1)
        grid[cell] = 0

    fill([0] * CELLS, 0)
    return tuple(grids)


@functools.cache
def all_sudoku_grids() -> tuple[tuple[int, ...], ...]:
    """All 288 solved 4x4 Sudoku grids (digits 1-4, row-major)."""
    return _fill_all(PEERS)


@functools.cache
def all_latin_squares() -> tuple[tuple[int, ...], ...]:
    """All 576 Latin squares of order 4 over digits 1-4 (row-major); map digits to symbols."""
    return _fill_all(LINE_PEERS)


@functools.cache
def _grid_array() -> np.ndarray:
    return np.array(all_sudoku_grids(), dtype=np.int8)                 # (288, 16)


def solutions(puzzle: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every grid consistent with the clues of `puzzle` (0 = blank)."""
    clues = np.array(puzzle, dtype=np.int8)
    fits = ((_grid_array() == clues) | (clues == 0)).all(axis=1)
    return [all_sudoku_grids()[i] for i in np.flatnonzero(fits)]


class SudokuTask(Task):
    """ParallelBench `sudoku_n4_12`: 12 clues, 4 blanks, unique solution, exact match."""

    name = "sudoku"

    def __init__(self, blanks: int = 4):
        self.blanks = blanks

    def _sample(self, rng: random.Random, length: int) -> Example:
        grids = all_sudoku_grids()
        while True:
            grid = grids[rng.randrange(len(grids))]
            holes = set(rng.sample(range(CELLS), self.blanks))
            puzzle = tuple(0 if i in holes else v for i, v in enumerate(grid))
            if len(solutions(puzzle)) == 1:
                return Example(self.name, "sudoku : " + " ".join(map(str, puzzle)),
                               " ".join(map(str, grid)), {"puzzle": list(puzzle)})

    def score(self, example: Example, output_text: str) -> float:
        return float(output_words(output_text) == example.answer.split())



